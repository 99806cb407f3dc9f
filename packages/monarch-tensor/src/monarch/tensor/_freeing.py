"""Freed ids with no batch to ride: one thread sends them after a short delay.

A dropped ``Tensor``'s id is deleted on the workers with the next batch of commands. Where
none follows soon (the end of an ``activate()`` that only dropped tensors, a loop of
fetches), sending the deletions at once would cost a broadcast on the caller's path, a
message each worker must take, for nothing the caller waits on: they go ``DELAY`` later,
unless a batch has carried them by then.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Protocol

DELAY = 0.05
"""Seconds freed ids wait for a batch to carry them before they are sent alone."""


class Freeing(Protocol):
    """A mesh's client, as this module sees it."""

    def send_freed(self) -> None:
        """Send the ids freed so far, unless commands are buffered (they carry them)."""


class _Later:
    """The clients with freed ids waiting, each with its deadline, and the thread."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: dict[Freeing, float] = {}
        self._thread: threading.Thread | None = None

    def schedule(self, client: Freeing) -> None:
        with self._changed:
            if client in self._due:
                return
            self._due[client] = time.monotonic() + DELAY
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="monarch-tensor-frees", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [client for client, at in self._due.items() if at <= now]
                if not due:
                    soonest = min(self._due.values(), default=None)
                    self._changed.wait(None if soonest is None else soonest - now)
                    continue
                for client in due:
                    del self._due[client]
            for client in due:
                try:
                    client.send_freed()
                except Exception:  # noqa: BLE001 - a stopped mesh: its ids are gone anyway
                    pass

    def forked(self) -> None:
        """In a forked child the thread is gone, and so are its parent's meshes."""
        self._changed = threading.Condition()
        self._due = {}
        self._thread = None


later = _Later()
os.register_at_fork(after_in_child=later.forked)
