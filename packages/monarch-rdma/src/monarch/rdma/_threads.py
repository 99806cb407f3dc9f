"""This process's RDMA threads: one named, bounded executor, shut down once at exit.

Everything RDMA does off the caller's thread and off the runtime loop runs here: the
operations of a batch (each may wait on its owner), the extra streams of a TCP transfer,
and the large writes an owner pulls for a peer. Two rules keep one bounded pool from
waiting on itself:

- a TCP transfer's extra streams are helpers: the transfer's own thread takes chunks
  too, and cancels the helpers that never started (``spread``), so it never waits on a
  task stuck behind others in the queue;
- an owner serves a pull here only while a thread is free (``saturated``); otherwise on
  the runtime loop (a copy of this host's memory, which waits on no one). So two
  processes whose operations all wait on each other's pulls still answer each other.

The ibverbs transport's reads of large frame parts (``_transport``) keep a pool of their
own: a frame waits for its parts, and the frames behind it (among them the answers the
operations here wait on) wait for it, so they must never queue behind those operations.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, TypeVar

T = TypeVar("T")

NAME: Final = "monarch-rdma"


class Threads:
    """A bounded ``ThreadPoolExecutor`` that knows how many of its tasks are unfinished."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pool = ThreadPoolExecutor(size, thread_name_prefix=NAME)
        self._lock = threading.Lock()
        self._unfinished = 0
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        with self._lock:
            self._unfinished += 1
        try:
            future = self._pool.submit(fn, *args)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: object) -> None:
        with self._lock:
            self._unfinished -= 1

    def saturated(self) -> bool:
        """Whether a task submitted now would wait for a thread."""
        return self._unfinished >= self.size

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
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Threads:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.shutdown()


def make(size: int) -> Threads:
    """The process's executor, shut down at exit."""
    threads = Threads(size)
    atexit.register(threads.shutdown)
    return threads
