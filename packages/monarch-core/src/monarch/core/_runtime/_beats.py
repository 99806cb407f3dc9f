"""Heartbeats, sent from a thread of their own.

A peer on another machine that hears nothing from us for ``heartbeat_timeout`` declares
us dead. On the loop, heartbeats would stop whenever the loop is busy: an async endpoint
computing for seconds, or importing torch (seconds; tens of them on a busy machine), is
no death. This thread beats whatever the loop is doing (except while a single call holds
the GIL throughout: a C extension's import, say).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Sequence

from monarch.core._placement import unpin_this_thread
from monarch.transport import Buffer, FrameQueue, TransportError

log = logging.getLogger("monarch.core.runtime")


class Beats:
    """The connections we beat on (their ``FrameQueue``, whose ``send_threadsafe`` any
    thread may call), each at the interval its peer asked for."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, FrameQueue]] = []
        self._beats: dict[FrameQueue, tuple[float, Sequence[Buffer]]] = {}
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, queue: FrameQueue, interval: float, beat: Sequence[Buffer]) -> None:
        """Send ``beat`` on ``queue`` every ``interval`` s from now on, until :meth:`remove`."""
        with self._changed:
            if self._closed:
                return
            self._beats[queue] = (interval, beat)
            heapq.heappush(self._due, (time.monotonic() + interval, next(self._order), queue))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, queue: FrameQueue) -> None:
        with self._changed:
            self._beats.pop(queue, None)  # its entry in _due is dropped when due

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._beats.clear()
            self._changed.notify()

    def _run(self) -> None:
        unpin_this_thread()  # started where the loop may be pinned (``_placement``)
        due = self._due
        while True:
            with self._changed:
                while not self._closed and (not due or due[0][0] > time.monotonic()):
                    self._changed.wait(due[0][0] - time.monotonic() if due else None)
                if self._closed:
                    return
                _, order, queue = heapq.heappop(due)
                entry = self._beats.get(queue)
                if entry is None:
                    continue  # removed
                interval, beat = entry
                heapq.heappush(due, (time.monotonic() + interval, order, queue))
            try:
                queue.send_threadsafe(beat)  # what the socket does not take goes next time
            except TransportError:
                self.remove(queue)  # the connection is gone; its reader reports that
            except Exception:
                log.exception("heartbeat on %r failed", queue)
                self.remove(queue)
