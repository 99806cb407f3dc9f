"""One thread of a process that waits on many file descriptors and timers, and calls back.

A host agent reads each of its procs' stdout and stderr and hears each exit. A thread per
pipe and per proc (three per proc with log forwarding: 3,072 for a mesh of 1,024) cost
memory, and where the process's threads are limited (a container's ``pids.max``) the agent
failed to start them mid-spawn, leaving procs it no longer watched. Instead one thread,
started at the first use, waits on all of them (``selectors``: epoll on Linux) and on
timers, and runs their callbacks one after another: a callback must not block.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import selectors
import threading
import time
from collections.abc import Callable

from monarch.core._placement import unpin_this_thread

log = logging.getLogger("monarch.core")

Ready = Callable[[], bool]
"""Called when its descriptor is readable (or closed); returns whether to keep watching."""


class FdWatch:
    """The thread, its selector, and what it waits on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._selector: selectors.BaseSelector | None = None
        self._wake_r = self._wake_w = -1
        self._added: list[tuple[int, Ready]] = []
        """Descriptors to watch, given by other threads since the thread last looked."""
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def add(self, fd: int, ready: Ready) -> None:
        """Call ``ready`` on the watching thread whenever ``fd`` is readable, until it
        returns False (the descriptor is then forgotten; its owner closes it). Raises
        ``RuntimeError`` where the thread cannot start."""
        with self._lock:
            self._started()
            self._added.append((fd, ready))
        self._wake()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the watching thread ``delay`` seconds from now."""
        with self._lock:
            self._started()
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), callback))
        self._wake()

    def _started(self) -> None:
        """Start the thread (under the lock), once."""
        if self._selector is not None:
            return
        selector = selectors.DefaultSelector()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        selector.register(wake_r, selectors.EVENT_READ, None)
        try:
            threading.Thread(
                target=self._run, args=(selector, wake_r), name="monarch-fd-watch", daemon=True
            ).start()
        except RuntimeError:
            selector.close()
            os.close(wake_r)
            os.close(wake_w)
            raise
        self._selector, self._wake_r, self._wake_w = selector, wake_r, wake_w

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):  # full: it will wake anyway
            pass

    def _run(self, selector: selectors.BaseSelector, wake_r: int) -> None:
        unpin_this_thread()  # started where the loop may be pinned (``_placement``)
        while True:
            with self._lock:
                added, self._added = self._added, []
                timeout = self._timers[0][0] - time.monotonic() if self._timers else None
            for fd, ready in added:
                try:
                    selector.register(fd, selectors.EVENT_READ, ready)
                except (OSError, ValueError, KeyError) as exc:  # closed, or watched already
                    log.warning("cannot watch descriptor %d: %s", fd, exc)
                    _call(ready)  # it reads the error, and ends what it watched
            if added:
                timeout = 0  # look at them at once: they may be readable already
            for key, _ in selector.select(None if timeout is None else max(timeout, 0.0)):
                if key.data is None:
                    _drain(wake_r)
                elif not _call(key.data):
                    selector.unregister(key.fd)
            now = time.monotonic()
            while True:
                with self._lock:
                    if not self._timers or self._timers[0][0] > now:
                        break
                    _, _, callback = heapq.heappop(self._timers)
                _call(callback)

    def forget(self) -> None:
        """In a forked child: the parent's thread is not here (nor anything it watched)."""
        if self._selector is not None:
            self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._lock = threading.Lock()
        self._selector = None
        self._wake_r = self._wake_w = -1
        self._added = []
        self._timers = []


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except (BlockingIOError, OSError):
        pass


def _call(callback: Callable[[], bool | None]) -> bool:
    """Run a callback; one that raises is logged and forgotten, the thread goes on."""
    try:
        return bool(callback())
    except Exception:
        log.exception("a descriptor's or timer's callback failed")
        return False


fd_watch = FdWatch()
"""This process's watching thread."""

os.register_at_fork(after_in_child=fd_watch.forget)
