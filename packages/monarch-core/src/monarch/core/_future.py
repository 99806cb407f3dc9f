"""``Future``: the result of every adverb, usable from sync code, asyncio, and endpoints.

A Future wraps a ``concurrent.futures.Future`` completed by the runtime's event loop,
which runs on its own thread in the controller and on the main thread of a worker.
``get()`` blocks the calling thread; ``await`` suspends the calling asyncio task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Generic, Protocol, TypeVar, cast

R = TypeVar("R")
T = TypeVar("T")

_loop_thread: threading.Thread | None = None
"""The thread running the runtime loop; ``get()`` there would deadlock."""


def set_loop_thread(thread: threading.Thread | None) -> None:
    global _loop_thread
    _loop_thread = thread


class Future(Generic[R]):
    """The eventual result of a Monarch operation. Not constructible by users."""

    __slots__ = ("_cf_", "_start")

    _cf_: concurrent.futures.Future[R] | None
    _start: Callable[[], concurrent.futures.Future[R]] | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Future cannot be constructed directly; Monarch operations return one")

    @classmethod
    def _wrap(cls, cf: concurrent.futures.Future[R]) -> Future[R]:
        future: Future[R] = object.__new__(cls)
        future._cf_ = cf
        future._start = None
        return future

    @classmethod
    def _lazy(cls, start: Callable[[], concurrent.futures.Future[R]]) -> Future[R]:
        """A future whose work starts when it is first observed."""
        future: Future[R] = object.__new__(cls)
        future._cf_ = None
        future._start = start
        return future

    @property
    def _cf(self) -> concurrent.futures.Future[R]:
        cf = self._cf_
        if cf is None:
            assert self._start is not None
            cf = self._cf_ = self._start()
            self._start = None
        return cf

    @classmethod
    def _of(cls, value: R) -> Future[R]:
        cf: concurrent.futures.Future[R] = concurrent.futures.Future()
        cf.set_result(value)
        return cls._wrap(cf)

    def get(self, timeout: float | None = None) -> R:
        """Block until the value is ready; ``TimeoutError`` after ``timeout`` seconds.

        A timeout leaves the operation running: a later ``get`` may still succeed.
        """
        if not self._cf.done():
            if threading.current_thread() is _loop_thread:
                raise RuntimeError(
                    "Future.get() inside an async endpoint would block the actor's event loop; "
                    "use `await future` instead"
                )
            if asyncio._get_running_loop() is not None:
                warnings.warn(
                    "Future.get() blocks the running event loop; use `await future` instead",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return self._cf.result(timeout)

    def result(self, timeout: float | None = None) -> R:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            self.get(timeout)
        except TimeoutError:
            raise
        except BaseException as exc:  # noqa: BLE001 - this method returns it
            return exc
        return None

    def done(self) -> bool:
        return self._cf.done()

    def as_asyncio(self) -> asyncio.Future[R]:
        """This future as an asyncio future of the running loop."""
        return asyncio.wrap_future(self._cf)

    def __await__(self) -> Generator[Any, None, R]:
        if asyncio._get_running_loop() is not None:
            return asyncio.wrap_future(self._cf).__await__()
        return _await_elsewhere(self._cf).__await__()

    def then(self, fn: Callable[[R], T]) -> Future[T]:
        """A future of ``fn(value)``, computed when this one completes."""
        out: concurrent.futures.Future[T] = concurrent.futures.Future()

        def done(cf: concurrent.futures.Future[R]) -> None:
            try:
                out.set_result(fn(cf.result()))
            except BaseException as exc:  # noqa: BLE001 - handed to the future
                out.set_exception(exc)

        self._cf.add_done_callback(done)
        return Future._wrap(out)

    def __repr__(self) -> str:
        state = "done" if self._cf.done() else "pending"
        return f"<monarch.actor.Future {state}>"


async def _await_elsewhere(cf: concurrent.futures.Future[R]) -> R:
    """Await from another async library (trio): wake the awaiting task through anyio."""
    import anyio
    import anyio.from_thread
    import anyio.lowlevel

    done = anyio.Event()
    token = anyio.lowlevel.current_token()

    def wake(_: concurrent.futures.Future[R]) -> None:
        try:
            anyio.from_thread.run_sync(done.set, token=token)
        except RuntimeError:  # completed on the awaiting thread itself
            done.set()

    cf.add_done_callback(wake)
    await done.wait()
    return cf.result()


class LoopRunner(Protocol):
    """What runs work on the runtime loop from any thread, in order (a Runtime)."""

    loop: asyncio.AbstractEventLoop

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None: ...


def submit_into(
    runner: LoopRunner, start: Callable[[concurrent.futures.Future[R]], None]
) -> Future[R]:
    """Run ``start(cf)`` on the loop, in call order; ``start`` arranges to complete ``cf``.

    The cheapest way back to the caller: whatever completes the operation sets ``cf``
    directly, with no asyncio future (and loop iteration) in between.
    """
    cf: concurrent.futures.Future[R] = concurrent.futures.Future()
    runner.call_soon(_start, start, cf)
    return Future._wrap(cf)


def _start(
    start: Callable[[concurrent.futures.Future[R]], None], cf: concurrent.futures.Future[R]
) -> None:
    if not cf.set_running_or_notify_cancel():
        return
    try:
        start(cf)
    except BaseException as exc:  # noqa: BLE001 - handed to the future
        if not cf.done():
            cf.set_exception(exc)


def run_on(runner: LoopRunner, coro: Coroutine[Any, Any, R]) -> Future[R]:
    """Run ``coro`` as a task of the runtime loop, started in order with ``call_soon``."""
    cf: concurrent.futures.Future[R] = concurrent.futures.Future()

    def start() -> None:
        if cf.cancelled():
            coro.close()
            return
        task = runner.loop.create_task(coro)
        task.add_done_callback(functools.partial(_copy_outcome, cf))
        cf.add_done_callback(
            lambda _: runner.loop.call_soon_threadsafe(task.cancel) if cf.cancelled() else None
        )

    runner.call_soon(start)
    return Future._wrap(cf)


def _copy_outcome(cf: concurrent.futures.Future[R], task: asyncio.Task[R]) -> None:
    if task.cancelled():
        cf.cancel()
        return
    if not cf.set_running_or_notify_cancel():
        return  # cancelled by its caller
    if (exc := task.exception()) is not None:
        cf.set_exception(exc)
    else:
        cf.set_result(task.result())


def returns_future(fn: Callable[..., Awaitable[R]]) -> Callable[..., Future[R]]:
    """Turn ``async def f(...) -> T`` into ``f(...) -> Future[T]``.

    Lazy, as upstream: the body runs when the future is first observed, on the
    runtime loop for ``get``/``result``, or on the awaiting loop for ``await``.
    """

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> Future[R]:
        return _CoroutineFuture._of_coroutine(
            lambda: cast(Coroutine[Any, Any, R], fn(*args, **kwargs))
        )

    return wrapper


class _CoroutineFuture(Future[R]):
    """The lazy future of ``returns_future``."""

    __slots__ = ("_make",)

    _make: Callable[[], Coroutine[Any, Any, R]] | None

    @classmethod
    def _of_coroutine(cls, make: Callable[[], Coroutine[Any, Any, R]]) -> _CoroutineFuture[R]:
        def start() -> concurrent.futures.Future[R]:
            from ._runtime import current_runtime

            body = future._make
            future._make = None
            assert body is not None
            return run_on(current_runtime(), body())._cf

        future: _CoroutineFuture[R] = cls._lazy(start)  # type: ignore[assignment]
        future._make = make
        return future

    def __await__(self) -> Generator[Any, None, R]:
        make = self._make
        if self._cf_ is not None or make is None:
            return super().__await__()
        self._make = None
        cf: concurrent.futures.Future[R] = concurrent.futures.Future()
        self._cf_ = cf
        self._start = None
        return _settle(make(), cf).__await__()


async def _settle(coro: Coroutine[Any, Any, R], cf: concurrent.futures.Future[R]) -> R:
    """Await ``coro`` here, recording its outcome in ``cf`` so the future can be re-read."""
    try:
        value = await coro
    except BaseException as exc:
        cf.set_exception(exc)
        raise
    cf.set_result(value)
    return value
