"""The runner of an async actor (all ``async def`` endpoints): a loop of its own, on a thread.

As upstream's: each async actor has its event loop, so its code may block on a Future
(``future.get()`` in an endpoint or in ``__init__``) and only that actor waits, while the
proc's loop keeps receiving (the reply among what it receives). Its messages are handled one
at a time by one task; a ``concurrent_endpoint`` body runs as a task of its own, started in
arrival order. Messages come from the proc's loop (``call_soon_threadsafe``); replies go out
from the actor's thread (``Runtime.post`` takes any thread); a task whose sends outrun a peer
waits at its next ``await``, not the thread (``_runtime._flow``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from time import monotonic
from typing import Any

from monarch.core._config import current_config
from monarch.core._errors import MeshFailure
from monarch.core._layout._shape import Point
from monarch.core._payload._serialize import loads
from monarch.core._placement import note_waiting, unpin_this_thread
from monarch.core._runner._context import Context
from monarch.core._runtime import Runtime, new_event_loop, suspend_senders
from monarch.core._runtime._messages import Call, SpawnActor
from monarch.core._runtime._scope import current_context, current_owner
from monarch.transport import Buffer

from ._actor_runner import EXIT, STOP, SUPERVISE, ActorRunner, Item, NoHandler

log = logging.getLogger("monarch.actor")


class AsyncRunner(ActorRunner):
    def __init__(self, runtime: Runtime, spawn: SpawnActor, cls: type | None) -> None:
        super().__init__(runtime, spawn, cls)
        self.loop = new_event_loop(runtime=False)
        """The actor's own loop (its thread's), where all its code runs."""
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        """The actor's messages, taken by its task."""
        self.concurrent: set[asyncio.Task[None]] = set()

    def start(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        unpickling: BaseException | None = None,
    ) -> None:
        """``unpickling``: why the class could not be read (the actor fails at once)."""
        self.thread = threading.Thread(
            target=self._run_thread,
            args=(args, kwargs, unpickling),
            name=f"actor-{self.spawn.name}",
            daemon=True,
        )
        try:
            self.thread.start()
        except RuntimeError:  # no thread: its loop will never run (``Unstarted``)
            self.loop.close()
            raise

    def _run_thread(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], unpickling: BaseException | None
    ) -> None:
        unpin_this_thread()  # started by the loop, which may be pinned (``_placement``)
        self.thread_id = threading.get_ident()
        loop = self.loop
        asyncio.set_event_loop(loop)
        suspend_senders(loop)  # a send that outruns its peer suspends its task, not the thread
        try:
            loop.run_until_complete(self._run_async(args, kwargs, unpickling))
            # what the actor left running (tasks of its own) ends with it
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    def _put(self, item: Item) -> None:
        if self._on_own_thread():
            self.queue.put_nowait(item)
        else:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
            except RuntimeError:  # its loop is closed: the actor is gone
                pass

    def queued(self) -> int:
        return self.queue.qsize()

    async def _run_async(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], unpickling: BaseException | None
    ) -> None:
        cls = self.cls
        try:
            if unpickling is not None:
                raise unpickling
            assert cls is not None
            self.instance = await self._construct(cls, args, kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure in __init__ fails the actor
            self._constructed(exc)
        else:
            self._constructed(None)
        while True:
            if self.queue.empty():
                note_waiting()  # the proc's loop comes to this CPU (``_placement``)
            kind, message, parts = await self.queue.get()
            if kind == EXIT:
                self.instance = self.cls = None  # see release()
                return
            if kind == STOP:
                await self._stop_async(message, parts)
            elif kind == SUPERVISE:
                await self._supervise_async(message)
            elif self.failure is not None or self.stopped is not None:
                self._refuse(message)
            else:
                await self._handle_async(message, parts)

    async def _construct(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The actor, made on its loop: its ``__init__`` may start tasks, and block on a
        Future as upstream's may (with upstream's warning)."""
        return await self._invoke(self.rank, cls, *args, **kwargs)

    async def _invoke(
        self, message_rank: Point, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        ctx = contextvars.copy_context()
        ctx.run(current_context.set, Context(self.info, message_rank))
        ctx.run(current_owner.set, self)
        if inspect.iscoroutinefunction(fn):
            try:
                return await ctx.run(asyncio.ensure_future, _contained(fn(*args, **kwargs)))
            except _Escaped as escaped:  # here it is caught like any other failure
                raise escaped.exc from None
        return ctx.run(fn, *args, **kwargs)

    async def _handle_async(self, call: Call, parts: Sequence[Buffer]) -> None:
        prop = self._endpoint(call)
        if prop is not None and prop._concurrent:
            task = self.loop.create_task(self._handle_one(call, parts))
            self.concurrent.add(task)
            task.add_done_callback(self.concurrent.discard)
            await asyncio.sleep(0)  # let it start before the next message: start order
        else:
            await self._handle_one(call, parts)

    async def _handle_one(self, call: Call, parts: Sequence[Buffer]) -> None:
        context = self._context_for(call)
        scope = self._scope(call, parts)
        self.handled += 1
        self.current = call.method
        self.began = monotonic()
        try:
            fn, args, kwargs = self._prepare(call, parts, context)
            result = await self._invoke(context.message_rank, fn, *args, **kwargs)
        except asyncio.CancelledError as exc:
            self.current = ""
            if scope is not None:
                scope.close(exc)
            if self.stopped is not None:  # a concurrent endpoint the stop cancelled
                self._refuse(call)
            raise
        except BaseException as exc:  # noqa: BLE001 - see _conclude
            self.current = ""
            if scope is not None:
                scope.close(exc)
            self._conclude(call, context, None, exc)
        else:
            self.current = ""
            if scope is not None:
                scope.close(None)
            self._conclude(call, context, result, None)

    async def _supervise_async(self, failure: MeshFailure) -> None:
        try:
            fn, args, _ = self._supervise_handler(failure)
            handled = await self._invoke(self.rank, fn, *args)
        except NoHandler:
            return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a raising handler fails its actor
            handled = exc
        self._supervised(failure, handled)

    async def _stop_async(self, stop: Call, parts: Sequence[Buffer]) -> None:
        if self.stopped is None:
            self.stopped = str(loads(parts))
            await self._stop_owned(f"owner {self.info.actor_id} stopped")
            for task in list(self.concurrent):
                task.cancel()
            cleanup = getattr(self.instance, "__cleanup__", None)
            if cleanup is not None and self.failure is None:
                try:
                    await asyncio.wait_for(self._cleanup(cleanup), current_config().cleanup_timeout)
                except TimeoutError:
                    log.warning("__cleanup__ of %s timed out", self.info.actor_id)
        self._reply_stopped(stop)

    async def _cleanup(self, cleanup: Callable[..., Any]) -> None:
        """Run ``__cleanup__``; whatever it raises is logged (in this task: a KeyboardInterrupt
        ending a task would end the proc's loop)."""
        try:
            await self._invoke(self.rank, cleanup, None)
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("__cleanup__ of %s failed", self.info.actor_id)


class _Escaped(Exception):
    """A KeyboardInterrupt or SystemExit raised by actor code, carried out of its task."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _contained(coro: Any) -> Any:
    """Run ``coro``; a KeyboardInterrupt or SystemExit comes out as ``_Escaped``: an
    asyncio task ending with one re-raises it out of the event loop, ending the proc,
    where upstream fails only the actor."""
    try:
        return await coro
    except (KeyboardInterrupt, SystemExit) as exc:
        raise _Escaped(exc) from None
