"""The one wait rule of every waiter: yield the CPU a while before going to sleep.

A reply, or the next message, usually comes within a few hundred microseconds; a thread
asleep in a lock or the poller would then be woken for it, and on a VM waking a halted CPU
costs more than the whole message. So every waiter of the process (a thread blocked on a
Future, an idle sync actor's thread, the loop after it handled messages) first yields the
CPU for ``wait_spin`` seconds, asking ``done()`` between yields; ``wait_spin = 0`` turns
all of them off at once. Yielding (``sched_yield``) rather than spinning hot hands the CPU,
and the GIL, to any thread that has work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from monarch.core._config import current_config


def spin_seconds() -> float:
    """How long a waiter yields before it sleeps (the ``wait_spin`` key, in seconds)."""
    spin: float = current_config().wait_spin
    return spin


def spin(done: Callable[[], object], seconds: float) -> bool:
    """Yield the CPU until ``done()`` is true or ``seconds`` have passed; whether it is."""
    deadline = time.perf_counter() + seconds
    while not done():
        if time.perf_counter() >= deadline:
            return False
        os.sched_yield()
    return True


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


USABLE_CPUS: Final = _usable_cpus()
"""CPUs this process may run on: a waiter spins only while others have one to spare."""


class BlockingListener(Protocol):
    """Told when a thread goes to sleep on a Future and when it wakes (the sync actors'
    pool, ``_runner._pool``: a thread asleep on a Future leaves its place to another)."""

    def blocking(self) -> None: ...

    def unblocked(self) -> None: ...


_listener = threading.local()


def set_blocking_listener(listener: BlockingListener | None) -> None:
    """The calling thread's sleeps on a Future are told to ``listener`` from now on."""
    _listener.value = listener


def blocking_listener() -> BlockingListener | None:
    """The calling thread's listener (``None``: most threads)."""
    listener: BlockingListener | None = getattr(_listener, "value", None)
    return listener
