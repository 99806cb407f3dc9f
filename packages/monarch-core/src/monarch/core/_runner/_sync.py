"""The runner of a sync actor (all ``def`` endpoints): its code runs on the process's pool.

Its messages wait in a queue of its own; a thread of the sync actors' pool (``_pool``)
takes the actor when it has some and runs them there, in order, and replies from there:
the proc's loop only decodes and routes, with no loop round trip per message, and a long
endpoint never stalls the proc. Replies to a burst are held and go out in one system call.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from time import monotonic
from typing import Any

from monarch.core._config import current_config
from monarch.core._errors import MeshFailure
from monarch.core._mesh._future import run_on
from monarch.core._payload._serialize import loads, loads_arguments
from monarch.core._placement import hosting
from monarch.core._runner._context import Context
from monarch.core._runtime import Runtime
from monarch.core._runtime._messages import Call, SpawnActor
from monarch.core._runtime._scope import current_context, current_owner
from monarch.transport import Buffer

from ._actor_runner import CALL, EXIT, STOP, ActorRunner, Item, NoHandler
from ._pool import ActorPool, actor_exited, pool_for_actor

INIT = "init"
"""The first item of a sync actor: make it (``cls(*args, **kwargs)``) on a pool thread."""

log = logging.getLogger("monarch.actor")


class SyncRunner(ActorRunner):
    def __init__(self, runtime: Runtime, spawn: SpawnActor, cls: type) -> None:
        super().__init__(runtime, spawn, cls)
        self.pool: ActorPool = pool_for_actor(spawn.name)
        self.calls: deque[Item] = deque()
        """The actor's messages, in order (appended and taken under the pool's lock)."""
        self.scheduled = False
        """Queued in the pool or run by one of its threads (under the pool's lock)."""
        self.exited = threading.Event()
        """Set once it handled ``EXIT`` (see ``release``)."""
        self.gave_back = False
        """Whether ``_give_thread_back`` ran (once, at its stop or exit)."""
        self.thread_name = f"actor-{spawn.name}"
        """What the pool thread running it is called meanwhile (stacks, py-spy)."""
        self._plain: dict[str, Callable[..., Any]] = {
            name: prop._method
            for name, prop in self.endpoints.items()
            if not prop._explicit_response_port and not _is_async_fn(prop._method)
        }
        """The declared ``def`` endpoints without a response port, by name: the thread
        calls them directly, without ``_prepare``."""

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._put((INIT, (args, kwargs), ()))

    def _put(self, item: Item) -> None:
        pool = self.pool
        with pool.lock:
            self.calls.append(item)
            if not self.scheduled:
                try:
                    pool.schedule(self)
                except RuntimeError:  # no thread could start to run it: never to be run
                    pool.ready.remove(self)
                    self.scheduled = False
                    self.calls.clear()
                    self.exited.set()
                    self._give_thread_back()
                    raise

    def queued(self) -> int:
        return len(self.calls)

    def has_work(self) -> bool:
        return bool(self.calls) and not self.exited.is_set()

    def join(self, timeout: float) -> None:
        self.exited.wait(timeout)

    def serve(self, batch: int) -> None:
        """Handle up to ``batch`` of its messages on this pool thread (see ``_pool``).

        Replies wait while more messages are queued (up to ``batch`` of them), then go
        out in one system call. Only replies: what the actor's own code sends goes out at
        once, as it may block waiting for an answer to it."""
        if self.exited.is_set():
            return
        self.thread_id = threading.get_ident()
        current_owner.set(self)
        calls = self.calls
        held: list[Any] = []
        try:
            for _ in range(batch):
                if not calls:  # only this thread takes from it (an exception costs ~1 us)
                    break
                kind, message, parts = calls.popleft()
                if kind == EXIT:
                    self.runtime.flush_writes(held)
                    self.instance = self.cls = None  # see release()
                    self.exited.set()
                    self._give_thread_back()
                    return
                try:
                    if kind == INIT:
                        self._construct(*message)
                    else:
                        self._serve_sync(kind, message, parts, held)
                except BaseException:
                    log.exception("actor %s could not handle a message", self.info.actor_id)
                # Nothing of a message outlives its handling here (its arguments and result
                # were locals of _serve_sync): a large one's memory is then free for the next
                # (see _memory.fresh_bytes), which the loop may be receiving already.
                del message, parts
            self.runtime.flush_writes(held)
        finally:
            self.thread_id = 0
            current_owner.set(None)
            current_context.set(None)

    def _construct(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cls = self.cls
        assert cls is not None
        current_context.set(Context(self.info, self.rank))
        try:
            self.instance = cls(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - any failure in __init__ fails the actor
            self._constructed(exc)
        else:
            self._constructed(None)

    def _serve_sync(
        self, kind: str, message: Any, parts: Sequence[Buffer], held: list[Any]
    ) -> None:
        if kind == CALL:
            if self.failure is not None or self.stopped is not None:
                self._refuse(message, held)
                return
            context = self._context_for(message)
            current_context.set(context)
            plain = self._plain.get(message.method)
            scope = self._scope(message, parts)
            self.handled += 1
            self.current = message.method
            self.began = monotonic()
            try:
                if plain is not None:  # the common case, in fewer steps (see _prepare)
                    args, kwargs = loads_arguments(parts)
                    result = plain(self.instance, *args, **kwargs)
                else:
                    fn, args, kwargs = self._prepare(message, parts, context)
                    result = self._call_sync(fn, args, kwargs)
            except BaseException as exc:  # noqa: BLE001 - see _conclude
                self.current = ""
                if scope is not None:
                    scope.close(exc)
                self._conclude(message, context, None, exc, held)
            else:
                self.current = ""
                if scope is not None:
                    scope.close(None)
                self._conclude(message, context, result, None, held)
        else:
            self.runtime.flush_writes(held)
            if kind == STOP:
                self._stop_sync(message, parts)
            else:
                self._supervise_sync(message)

    def _call_sync(
        self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
    ) -> Any:
        """Call actor code on its thread; an ``async def`` (an as_endpoint method, a
        ``__supervise__``) runs on the loop while the thread waits."""
        if not _is_async_fn(fn):
            return fn(*args, **kwargs)
        ctx = contextvars.copy_context()

        async def run() -> Any:
            with hosting():  # user code on the loop (``_placement``)
                return await ctx.run(asyncio.ensure_future, fn(*args, **kwargs))

        return run_on(self.runtime, run()).get()

    def _give_thread_back(self) -> None:
        """Stopped or exited: a thread of its own now serves the next actor (``_pool``);
        what this one still handles (refusals, ``__cleanup__``) queues there, in order."""
        if not self.gave_back:
            self.gave_back = True
            actor_exited(self.pool)

    def _stop_sync(self, stop: Call, parts: Sequence[Buffer]) -> None:
        if self.stopped is None:
            self.stopped = str(loads(parts))
            self._give_thread_back()  # before the reply: a spawn after it finds the thread
            if self.owned:
                run_on(self.runtime, self._stop_owned(f"owner {self.info.actor_id} stopped")).get()
            cleanup = getattr(self.instance, "__cleanup__", None)
            if cleanup is not None and self.failure is None:
                current_context.set(Context(self.info, self.rank))
                self._cleanup_sync(cleanup, stop)
                return
        self._reply_stopped(stop)

    def _cleanup_sync(self, cleanup: Callable[..., Any], stop: Call) -> None:
        """Run ``__cleanup__`` here; the stop completes at ``cleanup_timeout`` at the latest."""
        replied = threading.Lock()

        def reply() -> None:
            if replied.acquire(blocking=False):
                self._reply_stopped(stop)

        def expire() -> None:
            if not replied.locked():
                log.warning("__cleanup__ of %s timed out", self.info.actor_id)
                reply()

        timeout = current_config().cleanup_timeout
        self.runtime.call_soon(self.runtime.loop.call_later, timeout, expire)
        try:
            self._call_sync(cleanup, (None,), {})
        except BaseException:
            log.exception("__cleanup__ of %s failed", self.info.actor_id)
        reply()

    def _supervise_sync(self, failure: MeshFailure) -> None:
        current_context.set(Context(self.info, self.rank))
        try:
            handled = self._call_sync(*self._supervise_handler(failure))
        except NoHandler:
            return
        except BaseException as exc:  # noqa: BLE001 - a raising handler fails its actor
            handled = exc
        self._supervised(failure, handled)


def _is_async_fn(fn: Callable[..., Any]) -> bool:
    code = getattr(fn, "__code__", None)  # a plain function: one flag, no inspect call
    if code is not None and not hasattr(fn, "_is_coroutine_marker"):
        return bool(code.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn)
