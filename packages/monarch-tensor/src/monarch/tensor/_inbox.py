"""Values handed between actors of one process: what a worker receives from another mesh
(``to_mesh``) and the shards it lends to a user's actor (a monarch Tensor passed to an
endpoint).

A worker runs its commands in order on its own thread, so it cannot take a value through
one of its own endpoints while a command waits for it. Values arrive instead at a slot of
this process, keyed by the transfer, and the waiter takes them from there. (The actor that
delivers them, ``TensorInbox``, lives in ``_worker``: a proc unpickling two classes of two
modules of this package on two threads at once can deadlock in the import system.)
"""

from __future__ import annotations

import threading
import time
from typing import Any

_slots: dict[str, tuple[float, Any]] = {}
_changed = threading.Condition()

UNCLAIMED = 600.0
"""Seconds a value nobody took stays (a lent shard whose actor call went elsewhere)."""


def deliver(key: str, value: Any) -> None:
    """Put ``value`` in slot ``key`` and wake its waiter."""
    now = time.monotonic()
    with _changed:
        for old in [k for k, (at, _) in _slots.items() if now - at > UNCLAIMED]:
            del _slots[old]
        _slots[key] = (now, value)
        _changed.notify_all()


def take(key: str, timeout: float) -> Any:
    """The value of slot ``key`` (emptied), waiting up to ``timeout`` seconds for it."""
    with _changed:
        if not _changed.wait_for(lambda: key in _slots, timeout):
            raise TimeoutError(f"nothing arrived for {key} within {timeout:.0f} s")
        return _slots.pop(key)[1]
