"""This process's bulk-data threads: one executor, two lanes, shut down once at exit.

Everything the bulk wing does off the caller's thread and off the runtime loop runs here:
the helpers that split a large read of another process (``_memory_plane``), the
operations of an ``RDMAAction`` (each may wait on its owner), the extra streams of a TCP
transfer and the large writes an owner pulls for a peer (monarch-rdma), the reads of a
frame's offered parts (the ibverbs transport). Three rules keep one bounded executor from
waiting on itself:

- helpers are helpers (``spread``): the caller's own thread takes work too and cancels
  the helpers that never started, so it never waits on a task stuck behind others;
- an owner serves a pull here only while a thread is free (``saturated``); otherwise on
  the runtime loop (a copy of this host's memory, which waits on no one). So two
  processes whose operations all wait on each other's pulls still answer each other;
- what a frame waits for (``submit_urgent``: reading its large parts) never queues
  behind the bounded lane: the frames behind it, among them the answers the operations
  there wait for, wait for it. It runs on threads the bounded lane never fills.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, TypeVar

from monarch.core._config import current_config
from monarch.core._payload._per_process import PerProcess
from monarch.core._placement import unpin_this_thread

T = TypeVar("T")

NAME: Final = "monarch-bulk"
URGENT: Final = 4
"""Threads kept for the urgent lane beyond the bounded lane's."""
OPS_PER_STREAM: Final = 16
"""Operations that run at once, each with its streams (an ``RDMAAction``'s side by side):
the bounded lane holds ``OPS_PER_STREAM`` x ``streams()`` threads."""


def streams() -> int:
    """Streams per TCP transfer: upstream's ``rdma_runtime_worker_threads``, but no more
    than one per two CPUs (each stream is a thread here and one at the owner; on a small
    machine more streams only contend: measured on 2 cores, 1 stream beats 2)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return max(1, min(current_config().rdma_runtime_worker_threads, cpus // 2))


_Task = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]]


class Executor:
    """A bounded lane of ``size`` threads (tasks beyond wait in order) beside an urgent
    lane that never waits behind it, on one ``ThreadPoolExecutor``."""

    def __init__(self, size: int, urgent: int = URGENT) -> None:
        self.size = size
        self._pool = ThreadPoolExecutor(
            size + urgent, thread_name_prefix=NAME, initializer=unpin_this_thread
        )
        self._lock = threading.Lock()
        self._running = 0
        """Threads of the bounded lane now taken (each runs its task, then the waiting)."""
        self._waiting: deque[_Task] = deque()
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` in the bounded lane (after those waiting, if it is full)."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            start = self._running < self.size
            if start:
                self._running += 1
            else:
                self._waiting.append((future, fn, args))
        if start:
            try:
                self._pool.submit(self._run, (future, fn, args))
            except BaseException:
                with self._lock:
                    self._running -= 1
                raise
        return future

    def _run(self, task: _Task | None) -> None:
        while task is not None:
            future, fn, args = task
            failure: BaseException | None = None
            result: Any = None
            ran = future.set_running_or_notify_cancel()
            if ran:
                try:
                    result = fn(*args)
                except BaseException as error:  # noqa: BLE001 - handed to the future
                    failure = error
            with self._lock:  # freed before the future ends: its waiter sees the place
                task = self._waiting.popleft() if self._waiting else None
                if task is None:
                    self._running -= 1
            if not ran:
                continue
            if failure is not None:
                future.set_exception(failure)
            else:
                future.set_result(result)

    def submit_urgent(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` at once, never behind the bounded lane (see the module)."""
        return self._pool.submit(fn, *args)

    def saturated(self) -> bool:
        """Whether a task submitted now to the bounded lane would wait for a thread."""
        return self._running >= self.size

    def spread(self, run: Callable[[], None], helpers: int) -> list[BaseException]:
        """Run ``run`` here and in up to ``helpers`` threads at once (each call takes work
        from what they share until none is left); the errors they raised, once all that
        started have ended. Helpers still queued when ours ends are cancelled: by then
        the work they would have taken is done."""
        futures = [self.submit(run) for _ in range(helpers)]
        errors: list[BaseException] = []
        try:
            run()
        except BaseException as error:  # noqa: BLE001 - reported with the helpers'
            errors.append(error)
        for future in futures:
            if future.cancel():
                continue
            failure = future.exception()
            if failure is not None:
                errors.append(failure)
        return errors

    def shutdown(self) -> None:
        """Stop taking tasks and cancel those not started (once; at exit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting, self._waiting = self._waiting, deque()
        for future, _, _ in waiting:
            future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Executor:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.shutdown()


def _make() -> Executor:
    executor = Executor(OPS_PER_STREAM * streams())
    atexit.register(executor.shutdown)
    return executor


_executor = PerProcess(_make)


def bulk_executor() -> Executor:
    """This process's one bulk-data executor (made on first use, shut down at exit)."""
    return _executor.get()
