"""``Future``: the result of every adverb, usable from sync code, asyncio, and endpoints.

A Future wraps an ``Outcome`` completed by the runtime's event loop (which runs on its
own thread in the controller and on the main thread of a worker) or by an actor's
thread. ``get()`` blocks the calling thread; ``await`` suspends the calling task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import sys
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Final, Generic, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.lowlevel

from monarch.core._placement import hosting, note_waiting
from monarch.core._runtime import (
    USABLE_CPUS,
    Runtime,
    current_runtime,
    on_loop_thread,
    spin,
    spin_seconds,
)
from monarch.core._runtime._spin import blocking_listener

R = TypeVar("R")
T = TypeVar("T")

_log = logging.getLogger("monarch.actor")

_PENDING: Final = 0
_DONE: Final = 1
_outcome_lock = threading.Lock()
"""Guards every Outcome's transitions: held for a few instructions, so one is enough."""


class Outcome(Generic[R]):
    """A one-shot, thread-safe result: what ``concurrent.futures.Future`` offers, minus
    cancellation, in one small object.

    Thousands may be pending at once (pipelined calls), so it matters that each is a
    single object: no Condition, lock and lists per instance, which cost allocation and
    garbage-collector time. A thread that blocks in ``_wait`` gets a lock of its own.
    """

    __slots__ = ("_answering", "_callbacks", "_error", "_state", "_value", "_waiter")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._error: BaseException | None = None
        self._waiter: threading.Lock | None = None
        self._callbacks: list[Callable[[Outcome[R]], object]] | None = None
        self._answering = 1
        """Processes that must run for this to complete (see ``_wait``)."""

    def done(self) -> bool:
        return self._state == _DONE

    def set_result(self, value: R) -> None:
        self._settle(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def _settle(self, value: Any, error: BaseException | None) -> None:
        with _outcome_lock:
            if self._state == _DONE:
                raise concurrent.futures.InvalidStateError(f"{self!r} is already done")
            self._value = value
            self._error = error
            self._state = _DONE
            waiter, self._waiter = self._waiter, None
            callbacks, self._callbacks = self._callbacks, None
        if waiter is not None:
            waiter.release()
        if callbacks:
            for callback in callbacks:
                self._run(callback)

    def _run(self, callback: Callable[[Outcome[R]], object]) -> None:
        try:
            callback(self)
        except Exception:  # noqa: BLE001 - one failing callback must not stop the others
            _log.exception("a done callback of %r failed", self)

    def add_done_callback(self, callback: Callable[[Outcome[R]], object]) -> None:
        """Call ``callback(self)`` once done: now if it is, else on the completing thread."""
        with _outcome_lock:
            if self._state != _DONE:
                if self._callbacks is None:
                    self._callbacks = [callback]
                else:
                    self._callbacks.append(callback)
                return
        self._run(callback)

    def _wait(self, timeout: float | None = None) -> R:
        """The value (or raise the error), blocking up to ``timeout`` seconds."""
        if self._state != _DONE:
            note_waiting()  # the loop comes to this CPU (``_placement``)
            if self._answering < USABLE_CPUS:
                seconds = spin_seconds()
                if timeout is not None:
                    seconds = min(seconds, timeout)
                if seconds > 0:
                    # The waiters' rule (see _runtime._spin), only with a CPU to spare: when
                    # more processes than CPUs must answer, a spinning thread takes the CPU
                    # from them (and its sched_yield calls cost them context switches).
                    spin(lambda: self._state == _DONE, seconds)
        if self._state != _DONE:
            with _outcome_lock:
                waiter = self._waiter
                if self._state != _DONE and waiter is None:
                    waiter = self._waiter = threading.Lock()
                    waiter.acquire()
            if waiter is not None:
                # Released once by the completion; each waiter passes it on to the next.
                listener = blocking_listener()  # a sync actors' pool thread: see _pool
                if listener is not None:
                    listener.blocking()
                try:
                    got = waiter.acquire(timeout=-1 if timeout is None else max(timeout, 0))
                finally:
                    if listener is not None:
                        listener.unblocked()
                if not got:
                    raise TimeoutError
                waiter.release()
        if self._error is not None:
            raise self._error
        value: R = self._value
        return value

    def _failure(self) -> BaseException | None:
        """The error of a completed outcome (``None`` if it has a value)."""
        return self._error

    def _asyncio_future(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[R]:
        """An asyncio future of ``loop`` (the running one) completed with this outcome."""
        future: asyncio.Future[R] = loop.create_future()
        if self._state == _DONE:
            _copy_into(future, self)
        else:
            note_waiting()  # ``loop``'s thread waits: the runtime's loop comes to its CPU
            self.add_done_callback(functools.partial(_copy_soon, loop, future))
        return future


def _copy_soon(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[R], outcome: Outcome[R]
) -> None:
    """Complete ``future`` of ``loop``: at once on that loop's own thread (no wake-up of
    it, no turn), else through it."""
    if asyncio._get_running_loop() is loop:
        _copy_into(future, outcome)
    else:
        loop.call_soon_threadsafe(_copy_into, future, outcome)


def _copy_into(future: asyncio.Future[R], outcome: Outcome[R]) -> None:
    if future.done():
        return
    if outcome._error is not None:
        future.set_exception(outcome._error)
    else:
        future.set_result(outcome._value)


async def wait_outcome(outcome: Outcome[R]) -> R:
    """Await an outcome on the running asyncio loop."""
    return await outcome._asyncio_future(asyncio.get_running_loop())


BLOCKING_GET: Final = (
    "Future.get() was called from within an active event loop. Because this method blocks "
    "synchronously and does not yield control, it may degrade performance by preventing other "
    "tasks from running, and can potentially cause deadlocks if this future depends on them. "
    "It is encouraged to use as_asyncio() (or await) instead."
)


class Future(Outcome[R]):
    """The eventual result of a Monarch operation. Not constructible by users.

    A Future is its own outcome: the runtime completes it directly, so a pending call
    costs one object.
    """

    __slots__ = ("_start",)

    _start: Callable[[Future[R]], None] | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            "Future objects are returned by Monarch operations and cannot be constructed directly."
        )

    @classmethod
    def _new(cls) -> Future[R]:
        future: Future[R] = object.__new__(cls)
        Outcome.__init__(future)
        future._start = None
        return future

    @classmethod
    def _lazy(cls, start: Callable[[Future[R]], None]) -> Future[R]:
        """A future whose work, ``start(future)``, begins when it is first observed."""
        future: Future[R] = cls._new()
        future._start = start
        return future

    @property
    def _cf(self) -> Future[R]:
        """This future, its work started (see ``_lazy``)."""
        if self._start is not None:
            with _outcome_lock:
                start, self._start = self._start, None
            if start is not None:
                start(self)
        return self

    @classmethod
    def _of(cls, value: R) -> Future[R]:
        future: Future[R] = cls._new()
        future.set_result(value)
        return future

    def get(self, timeout: float | None = None) -> R:
        """Block until the value is ready; ``TimeoutError`` after ``timeout`` seconds.

        A timeout leaves the operation running: a later ``get`` may still succeed.
        """
        if self._cf._state != _DONE:
            if on_loop_thread():
                raise RuntimeError(
                    "Future.get() on the runtime's own event loop would block the loop that "
                    "receives its result; use `await future` instead"
                )
            if asyncio._get_running_loop() is not None and not _in_notebook_cell():
                warnings.warn(BLOCKING_GET, UserWarning, stacklevel=2)  # upstream's warning
        return self._wait(timeout)

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
        return self._cf._state == _DONE

    def as_asyncio(self) -> asyncio.Future[R]:
        """This future as an asyncio future of the running loop."""
        return self._cf._asyncio_future(asyncio.get_running_loop())

    def __await__(self) -> Generator[Any, None, R]:
        loop = asyncio._get_running_loop()
        if loop is not None:
            future = self._cf._asyncio_future(loop)
            if not future.done() and _in_notebook_cell():
                _tick_until_done(loop, future)
                return _interrupted_as_in_get(future).__await__()
            return future.__await__()
        return _await_elsewhere(self._cf).__await__()

    def then(self, fn: Callable[[R], T]) -> Future[T]:
        """A future of ``fn(value)``, computed when this one completes."""
        out: Future[T] = Future._new()

        def done(outcome: Outcome[R]) -> None:
            try:
                with hosting():  # user code, perhaps on the loop (``_placement``)
                    value = fn(outcome._wait())
                out.set_result(value)
            except BaseException as exc:  # noqa: BLE001 - handed to the future
                out.set_exception(exc)

        self._cf.add_done_callback(done)
        return out

    def __repr__(self) -> str:
        state = "done" if self._state == _DONE else "pending"
        return f"<monarch.actor.Future {state}>"


def _in_notebook_cell() -> bool:
    """Whether this is the main thread of an IPython kernel, whose loop runs every cell.

    Blocking there in ``get()`` holds only the kernel's loop, never the runtime's (its
    own thread), so upstream's warning would only be noise under every notebook cell.
    """
    ipython = sys.modules.get("IPython")
    return (
        ipython is not None
        and threading.current_thread() is threading.main_thread()
        and getattr(ipython, "get_ipython", lambda: None)() is not None
    )


NOTEBOOK_TICK: Final = 0.05
"""Seconds between wake-ups of a notebook kernel's loop while a cell awaits a Future."""


def _tick_until_done(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
    """Wake ``loop`` every ``NOTEBOOK_TICK`` until ``future`` is done.

    An interrupt of an ipykernel kernel (Ctrl-C, the stop button) cancels an awaiting
    cell from a callback that the kernel queues without waking its loop: a loop asleep
    until the Future completes would not see it. Only while a cell awaits.
    """

    def tick() -> None:
        if not future.done():
            loop.call_later(NOTEBOOK_TICK, tick)

    loop.call_later(NOTEBOOK_TICK, tick)


async def _interrupted_as_in_get(future: asyncio.Future[R]) -> R:
    """Await ``future`` in a notebook cell; a kernel interrupt raises ``KeyboardInterrupt``.

    ipykernel turns an interrupt of an awaiting cell into a cancel of the cell's task
    (``CancelledError``); ``get()`` there ends with ``KeyboardInterrupt``, and so does this,
    but only when the cancelled task is the cell's own (IPython's ``run_cell_async``), whose
    ``KeyboardInterrupt`` IPython catches and shows: an inner task's must stay a cancel, or
    it would escape into the kernel's event loop.
    """
    try:
        return await future
    except asyncio.CancelledError:
        task = asyncio.current_task()
        coroutine = task.get_coro() if task is not None else None
        if getattr(coroutine, "__qualname__", "").endswith(".run_cell_async"):
            raise KeyboardInterrupt from None
        raise


async def _await_elsewhere(outcome: Outcome[R]) -> R:
    """Await from another async library (trio): wake the awaiting task through anyio."""
    done = anyio.Event()
    token = anyio.lowlevel.current_token()

    def wake(_: Outcome[R]) -> None:
        try:
            anyio.from_thread.run_sync(done.set, token=token)
        except RuntimeError:  # completed on the awaiting thread itself
            done.set()

    note_waiting()  # the awaiting thread: the runtime's loop comes to its CPU
    outcome.add_done_callback(wake)
    await done.wait()
    return outcome._wait()


def submit_into(runner: Runtime, start: Callable[..., None], *args: Any) -> Future[R]:
    """Run ``start(*args, future)`` on the loop, in call order; it arranges to complete
    the future it is given.

    The cheapest way back to the caller: whatever completes the operation completes the
    future directly, with no asyncio future (and loop iteration) in between.
    """
    future: Future[R] = Future._new()
    runner.call_soon(_start, future, start, *args)
    return future


def _start(future: Future[R], start: Callable[..., None], *args: Any) -> None:
    try:
        start(*args, future)
    except BaseException as exc:  # noqa: BLE001 - handed to the future
        if not future.done():
            future.set_exception(exc)


def run_on(runner: Runtime, coro: Coroutine[Any, Any, R]) -> Future[R]:
    """Run ``coro`` as a task of the runtime loop, started in order with ``call_soon``."""
    future: Future[R] = Future._new()
    _run_into(runner, coro, future)
    return future


def _run_into(runner: Runtime, coro: Coroutine[Any, Any, R], future: Outcome[R]) -> None:
    def start() -> None:
        task = runner.loop.create_task(coro)
        task.add_done_callback(functools.partial(_copy_outcome, future))

    runner.call_soon(start)


def _copy_outcome(future: Outcome[R], task: asyncio.Task[R]) -> None:
    if task.cancelled():
        future.set_exception(asyncio.CancelledError("the runtime stopped the operation"))
    elif (exc := task.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())


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
        def start(future: Future[R]) -> None:
            body = this._make
            this._make = None
            assert body is not None
            _run_into(current_runtime(), body(), future)

        this: _CoroutineFuture[R] = cls._lazy(start)  # type: ignore[assignment]
        this._make = make
        return this

    def __await__(self) -> Generator[Any, None, R]:
        make = self._make
        if self._start is None or make is None:
            return super().__await__()
        self._make = None
        self._start = None
        return _settle(make(), self).__await__()


async def _settle(coro: Coroutine[Any, Any, R], outcome: Outcome[R]) -> R:
    """Await ``coro`` here, recording how it ended so the future can be read again."""
    try:
        value = await coro
    except BaseException as exc:
        outcome.set_exception(exc)
        raise
    outcome.set_result(value)
    return value
