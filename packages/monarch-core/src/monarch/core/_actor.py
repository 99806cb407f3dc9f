"""Actors, endpoints and actor meshes: the user-facing half of messaging.

The caller side (``ActorMesh``, ``Endpoint`` adverbs) pickles arguments once per cast,
posts one message per destination process (from the caller's own thread when it can),
and gathers replies on a port into a ValueMesh. The callee side: ``_LocalMesh`` takes a
mesh's messages for the actors of one process in order, ``_ActorHost`` runs one actor:
one message at a time, FIFO per sender, async endpoints on the proc's loop and sync
endpoints on the actor's own thread, so a long sync endpoint never stalls the proc.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import inspect
import logging
import os
import queue
import random
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

import msgspec

from monarch.transport import Buffer

from ._cast import ReceiveOrder
from ._config import current_config
from ._future import Future, Outcome, run_on, submit_into, wait_outcome
from ._messages import (
    STOP_METHOD,
    TO_PROC,
    ActorFailed,
    Body,
    Call,
    PortBatch,
    PortRef,
    PortValue,
    ShapeSpec,
    SpawnActor,
)
from ._runtime import Runtime, current_runtime
from ._serialize import dumps, dumps_arguments, loads, loads_arguments
from ._shape import Extent, MeshTrait, NDSlice, Point, Shape, ShapedMesh
from ._supervision import MeshFailure, call_fault_hook
from ._value_mesh import ValueMesh

log = logging.getLogger("monarch.actor")

R = TypeVar("R")
A = TypeVar("A")


# -- errors ----------------------------------------------------------------------------


class ActorError(Exception):
    """An endpoint raised: the original exception and the remote traceback."""

    def __init__(
        self, exception: BaseException, message: str = "A remote actor call failed"
    ) -> None:
        self.exception = exception
        self.message = message
        self.exception_formatted = "".join(
            traceback.format_exception(type(exception), exception, exception.__traceback__)
        )
        super().__init__(exception, message)

    def __str__(self) -> str:
        return f"{self.message}:\n{self.exception_formatted}"


class SupervisionError(RuntimeError):
    """The target actor or its proc has failed; the call cannot complete."""


class _RemoteFailure:
    """What travels back when an endpoint raises: the exception and its traceback text."""

    def __init__(self, exception: BaseException, formatted: str, message: str) -> None:
        self.exception = exception
        self.formatted = formatted
        self.message = message

    @classmethod
    def of(cls, exc: BaseException, message: str) -> _RemoteFailure:
        formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            dumps(exc)
        except Exception:  # noqa: BLE001 - an unpicklable exception travels as text
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return cls(exc, formatted, message)

    def to_error(self) -> Exception:
        if isinstance(self.exception, SupervisionError):
            return self.exception
        error = ActorError(self.exception, self.message)
        error.exception_formatted = self.formatted
        return error


# -- endpoints ---------------------------------------------------------------------------


class EndpointProperty(Generic[R]):
    """What ``@endpoint`` makes of a method: the function plus its calling options."""

    def __init__(
        self,
        method: Callable[..., Any],
        *,
        propagate: Any = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
        concurrent: bool = False,
    ) -> None:
        self._method = method
        self._propagate = propagate
        self._explicit_response_port = explicit_response_port
        self._instrument = instrument
        self._concurrent = concurrent
        self._signature = inspect.signature(method)
        self._arity = _positional_arity(self._signature)
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self._method)

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self._method.__get__(instance, owner)


@overload
def endpoint(method: Callable[..., Any]) -> Any: ...


@overload
def endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = True
) -> Callable[[Callable[..., Any]], Any]: ...


def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an actor method as callable through meshes (bare or with options)."""

    def wrap(fn: Callable[..., Any]) -> EndpointProperty[Any]:
        if isinstance(fn, EndpointProperty):
            raise TypeError("endpoint applied twice")
        return EndpointProperty(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
        )

    return wrap(method) if method is not None else wrap


@overload
def concurrent_endpoint(method: Callable[..., Any]) -> Any: ...


@overload
def concurrent_endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = True
) -> Callable[[Callable[..., Any]], Any]: ...


def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Like ``@endpoint`` for an ``async def`` whose body runs as its own task.

    Later messages proceed while it awaits; bodies start in arrival order per
    sender. Pending bodies are cancelled before ``__cleanup__``.
    """

    def wrap(fn: Callable[..., Any]) -> EndpointProperty[Any]:
        if isinstance(fn, EndpointProperty):
            raise TypeError("do not stack @concurrent_endpoint with @endpoint")
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@concurrent_endpoint needs an async def, not {fn!r}")
        return EndpointProperty(
            fn,
            propagate=propagate,
            explicit_response_port=explicit_response_port,
            instrument=instrument,
            concurrent=True,
        )

    return wrap(method) if method is not None else wrap


def _positional_arity(signature: inspect.Signature) -> tuple[int, int] | None:
    """(fewest, most) positional arguments a plain signature takes, self included;
    ``None`` when it has ``*args``, ``**kwargs`` or keyword-only parameters."""
    fewest = most = 0
    for param in signature.parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            return None
        most += 1
        if param.default is param.empty:
            fewest = most
    return fewest, most


def _endpoints(cls: type) -> dict[str, EndpointProperty[Any]]:
    found: dict[str, EndpointProperty[Any]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty):
                found[name] = value
            else:
                found.pop(name, None)
    return found


def _actor_is_async(cls: type) -> bool:
    kinds = {name: prop.is_async for name, prop in _endpoints(cls).items()}
    if len(set(kinds.values())) > 1:
        sync = sorted(n for n, a in kinds.items() if not a)
        asyn = sorted(n for n, a in kinds.items() if a)
        raise ValueError(
            f"{cls.__name__} mixes sync endpoints {sync} and async endpoints {asyn}; "
            "an actor's endpoints must be all `def` or all `async def`"
        )
    return any(kinds.values())


# -- the actor base class and its context -----------------------------------------------


class Actor(MeshTrait):
    """Base class of user actors: private state, one message at a time.

    A MeshTrait as upstream's is, so that ``procs.spawn(name, MyActor)`` (typed as
    returning ``MyActor``) type-checks the mesh operations of the ActorMesh it returns.
    An actor instance itself is not a mesh.
    """

    @property
    def _ndslice(self) -> NDSlice:
        raise TypeError("an actor is not a mesh; slice the ActorMesh that spawn() returned")

    @property
    def _labels(self) -> Sequence[str]:
        raise TypeError("an actor is not a mesh; slice the ActorMesh that spawn() returned")

    def _new_with_shape(self, shape: Shape) -> Actor:
        raise TypeError("an actor is not a mesh; slice the ActorMesh that spawn() returned")

    @functools.cached_property
    def logger(self) -> logging.Logger:
        return logging.getLogger(f"{type(self).__module__}.{type(self).__qualname__}")


@dataclass(frozen=True)
class Instance:
    """The running actor: where it sits in the mesh it was spawned on."""

    rank: Point
    name: str
    class_name: str
    actor_id: str
    proc_id: str
    creator: str | None = None
    """The process that spawned this actor (``None`` for the root client)."""

    @property
    def proc(self) -> Any:
        """This actor's own process, as a ProcMesh of one: ``spawn`` on it stays local."""
        from ._proc_mesh import this_proc

        return this_proc()

    @property
    def proc_mesh(self) -> Any:
        return self.proc

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor after the message it is handling (``__cleanup__`` runs)."""
        self._host().request_stop(reason or "stopped by itself")

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor: its owner is told, later calls raise SupervisionError."""
        self._host().request_abort(reason or "aborted by itself")

    def kill(self, reason: str | None = None) -> None:
        """Like :meth:`abort`: the actor fails without running ``__cleanup__``."""
        self._host().request_abort(reason or "killed by itself")

    def _host(self) -> _ActorHost:
        host = _live_hosts.get(self.actor_id)
        if host is None:
            raise RuntimeError(
                f"{self.actor_id} is not an actor running in this process (the root client "
                "is stopped with shutdown_context())"
            )
        return host


@dataclass(frozen=True)
class Context:
    actor_instance: Instance
    message_rank: Point


_EMPTY_POINT = Point(0, Extent([], []))
_host_var: contextvars.ContextVar[_ActorHost | None] = contextvars.ContextVar(
    "monarch_actor_host", default=None
)
"""The actor whose code is running: the owner of any mesh that code spawns."""
_context: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "monarch_context", default=None
)


def context() -> Context:
    """The running actor and the message's rank; on the client, the root client context."""
    current = _context.get()
    if current is not None:
        return current
    runtime = current_runtime()
    return Context(
        Instance(
            _EMPTY_POINT, "client", "RootClientActor", f"{runtime.address}/client", runtime.address
        ),
        _EMPTY_POINT,
    )


def current_rank() -> Point:
    return context().message_rank


def current_size() -> dict[str, int]:
    return dict(context().message_rank.extent.items())


def current_actor_name() -> str:
    return context().actor_instance.name


# -- the callee side ---------------------------------------------------------------------


def _shape_spec(shape: Shape) -> ShapeSpec:
    s = shape.ndslice
    return ShapeSpec(tuple(shape.labels), s.offset, tuple(s.sizes), tuple(s.strides))


def _shape_of(spec: ShapeSpec) -> Shape:
    return Shape(list(spec.labels), NDSlice(spec.offset, list(spec.sizes), list(spec.strides)))


HELD_REPLIES = 32
"""Most replies a sync actor's thread holds back while more messages wait."""
_STOP = "stop"
_CALL = "call"
_SUPERVISE = "supervise"


class _ActorHost:
    """Runs one actor inside its proc: its messages one at a time, in order.

    A sync actor (``def`` endpoints) lives on a thread of its own, which takes its
    messages from a queue and replies from there: the proc's loop only decodes and
    routes, with no loop round trip per message. An async actor's messages are
    handled by a task on the proc's loop.
    """

    def __init__(self, runtime: Runtime, spawn: SpawnActor, payload: Sequence[Buffer]) -> None:
        self.runtime = runtime
        self.spawn = spawn
        self.failure: BaseException | None = None
        self.stopped: str | None = None
        self.instance: Any = None
        self.endpoints: dict[str, EndpointProperty[Any]] = {}
        shape = _shape_of(spawn.shape)
        self.rank = Point(shape.ndslice.index(spawn.rank), shape.extent)
        actor_id = f"{runtime.address}/{spawn.mesh}[{self.rank.rank}]"
        self.info = Instance(
            self.rank, spawn.name, "?", actor_id, runtime.address, spawn.reply.proc
        )
        self._contexts: dict[ShapeSpec, Context] = {}
        self.concurrent: set[asyncio.Task[None]] = set()
        self.owned: list[Any] = []
        """Meshes this actor spawned: they are stopped before it, and die with it."""
        self.calls: queue.SimpleQueue[tuple[str, Any, Sequence[Buffer]]] | None = None
        """A sync actor's messages, taken by its thread."""
        self._plain: dict[str, Callable[..., Any]] = {}
        """A sync actor's declared ``def`` endpoints without a response port, by name:
        its thread calls them directly, without ``_prepare``."""
        self.thread_id: int | None = None
        """A sync actor's thread (``threading.get_ident``)."""
        self.queue: asyncio.Queue[tuple[str, Any, Sequence[Buffer]]] = asyncio.Queue()
        """An async actor's messages, taken by its task."""
        try:
            cls, args, kwargs = loads(payload)
            self.info = dataclasses.replace(self.info, class_name=cls.__name__)
            self.endpoints = _endpoints(cls)
            is_async = _actor_is_async(cls)
        except Exception as exc:  # noqa: BLE001 - reported as the spawn's failure
            runtime.spawn_task(self._run_async(None, (), {}, exc))
            return
        if is_async:
            runtime.spawn_task(self._run_async(cls, args, kwargs))
        else:
            self.calls = queue.SimpleQueue()
            self._plain = {
                name: prop._method
                for name, prop in self.endpoints.items()
                if not prop._explicit_response_port and not _is_async_fn(prop._method)
            }
            threading.Thread(
                target=self._run_sync,
                args=(cls, args, kwargs),
                name=f"actor-{spawn.name}",
                daemon=True,
            ).start()

    # -- routing (loop thread) -------------------------------------------------------

    def enqueue(self, call: Call, payload: Sequence[Buffer]) -> None:
        """A call for this actor, in order (see ``_LocalMesh``)."""
        # A stop is queued like any message: it drains what came before it.
        self._put((_STOP if call.method == STOP_METHOD else _CALL, call, payload))

    def _put(self, item: tuple[str, Any, Sequence[Buffer]]) -> None:
        if self.calls is not None:
            self.calls.put(item)
        else:
            self.queue.put_nowait(item)

    def supervise(self, failure: MeshFailure) -> None:
        """A mesh this actor owns failed: ``__supervise__`` runs between messages."""
        self._put((_SUPERVISE, failure, ()))

    def request_stop(self, reason: str) -> None:
        """Stop once the messages queued so far are handled (from any thread).

        From the actor's own code the stop is queued at once, before the reply to the
        message being handled goes out: a call sent after that reply is refused."""
        stop = (_STOP, Call(self.spawn.mesh, STOP_METHOD, self.spawn.shape), dumps(reason))
        if self.runtime.on_loop() or threading.get_ident() == self.thread_id:
            self._put(stop)
        else:
            self.runtime.call_soon(self._put, stop)

    def request_abort(self, reason: str) -> None:
        """Fail now (from any thread): as if an endpoint had raised with nobody to tell."""
        self._fail(RuntimeError(reason), reason)

    def _context_for(self, call: Call) -> Context:
        """The context of a message: this actor's rank within the shape it was cast to
        (cached per shape)."""
        context = self._contexts.get(call.shape)
        if context is None:
            if len(self._contexts) >= 64:
                self._contexts.clear()
            shape = _shape_of(call.shape)
            point = Point(shape.ndslice.index(self.spawn.rank), shape.extent)
            context = self._contexts[call.shape] = Context(self.info, point)
        return context

    # -- a sync actor: its thread ----------------------------------------------------

    def _run_sync(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.thread_id = threading.get_ident()
        _host_var.set(self)
        _context.set(Context(self.info, self.rank))
        try:
            self.instance = cls(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - any failure in __init__ fails the actor
            self._reply(self.spawn.reply, exc, error=True)
            self._fail(exc, "__init__ raised")
        else:
            self._reply(self.spawn.reply, None)
        calls = self.calls
        assert calls is not None
        # Replies wait here while more messages are queued (up to HELD_REPLIES of them),
        # then go out in one system call. Only replies: what the actor's own code sends
        # goes out at once, as it may block waiting for an answer to it.
        held: list[Any] = []
        pending = 0
        flush_writes = self.runtime.flush_writes
        while True:
            if held and (pending >= HELD_REPLIES or calls.empty()):
                flush_writes(held)
                pending = 0
            if calls.empty():
                _await_message(calls)
            kind, message, parts = calls.get()
            if kind == _CALL:
                pending += 1
            try:
                self._serve_sync(kind, message, parts, held)
            except Exception:
                log.exception("actor %s could not handle a message", self.info.actor_id)
            # Nothing of a message outlives its handling here (its arguments and result
            # were locals of _serve_sync): a large one's memory is then free for the next
            # (see _memory.fresh_bytes), which the loop may be receiving already.
            del message, parts

    def _serve_sync(
        self, kind: str, message: Any, parts: Sequence[Buffer], held: list[Any]
    ) -> None:
        if kind == _CALL:
            if self.failure is not None or self.stopped is not None:
                self._refuse(message, held)
                return
            context = self._context_for(message)
            _context.set(context)
            plain = self._plain.get(message.method)
            try:
                if plain is not None:  # the common case, in fewer steps (see _prepare)
                    args, kwargs = loads_arguments(parts)
                    result = plain(self.instance, *args, **kwargs)
                else:
                    fn, args, kwargs = self._prepare(message, parts, context)
                    result = self._call_sync(fn, args, kwargs)
            except BaseException as exc:  # noqa: BLE001 - see _conclude
                self._conclude(message, context, None, exc, held)
            else:
                self._conclude(message, context, result, None, held)
        else:
            self.runtime.flush_writes(held)
            if kind == _STOP:
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
            return await ctx.run(asyncio.ensure_future, fn(*args, **kwargs))

        return run_on(self.runtime, run()).get()

    def _stop_sync(self, stop: Call, parts: Sequence[Buffer]) -> None:
        if self.stopped is None:
            self.stopped = str(loads(parts))
            if self.owned:
                run_on(self.runtime, self._stop_owned(f"owner {self.info.actor_id} stopped")).get()
            cleanup = getattr(self.instance, "__cleanup__", None)
            if cleanup is not None and self.failure is None:
                _context.set(Context(self.info, self.rank))
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
        except Exception:
            log.exception("__cleanup__ of %s failed", self.info.actor_id)
        reply()

    # -- an async actor: its task on the loop ---------------------------------------

    async def _run_async(
        self,
        cls: type | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        unpickling: Exception | None = None,
    ) -> None:
        """``unpickling``: why the class could not be read (the actor fails at once)."""
        spawn = self.spawn
        try:
            if unpickling is not None:
                raise unpickling
            assert cls is not None
            self.instance = await self._invoke(self.rank, cls, *args, **kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure in __init__ fails the actor
            self._reply(spawn.reply, exc, error=True)
            self._fail(exc, "__init__ raised")
        else:
            self._reply(spawn.reply, None)
        while True:
            kind, message, parts = await self.queue.get()
            if kind == _STOP:
                await self._stop_async(message, parts)
            elif kind == _SUPERVISE:
                await self._supervise_async(message)
            elif self.failure is not None or self.stopped is not None:
                self._refuse(message)
            else:
                await self._handle_async(message, parts)

    async def _invoke(
        self, message_rank: Point, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        ctx = contextvars.copy_context()
        ctx.run(_context.set, Context(self.info, message_rank))
        ctx.run(_host_var.set, self)
        if inspect.iscoroutinefunction(fn):
            return await ctx.run(asyncio.ensure_future, fn(*args, **kwargs))
        return ctx.run(fn, *args, **kwargs)

    async def _handle_async(self, call: Call, parts: Sequence[Buffer]) -> None:
        prop = self._endpoint(call)
        if prop is not None and prop._concurrent:
            task = self.runtime.loop.create_task(self._handle_one(call, parts))
            self.concurrent.add(task)
            task.add_done_callback(self.concurrent.discard)
            await asyncio.sleep(0)  # let it start before the next message: start order
        else:
            await self._handle_one(call, parts)

    async def _handle_one(self, call: Call, parts: Sequence[Buffer]) -> None:
        context = self._context_for(call)
        try:
            fn, args, kwargs = self._prepare(call, parts, context)
            result = await self._invoke(context.message_rank, fn, *args, **kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - see _conclude
            self._conclude(call, context, None, exc)
        else:
            self._conclude(call, context, result, None)

    async def _supervise_async(self, failure: MeshFailure) -> None:
        try:
            fn, args, _ = self._supervise_handler(failure)
            handled = await self._invoke(self.rank, fn, *args)
        except _NoHandler:
            return
        except Exception as exc:  # noqa: BLE001 - a raising handler fails its actor
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
                    await asyncio.wait_for(
                        self._invoke(self.rank, cleanup, None), current_config().cleanup_timeout
                    )
                except TimeoutError:
                    log.warning("__cleanup__ of %s timed out", self.info.actor_id)
                except Exception:
                    log.exception("__cleanup__ of %s failed", self.info.actor_id)
        self._reply_stopped(stop)

    # -- both kinds ---------------------------------------------------------------------

    def _endpoint(self, call: Call) -> EndpointProperty[Any] | None:
        prop = self.endpoints.get(call.method)
        if prop is None and not call.method.startswith("_"):
            # A plain method called through as_endpoint().
            method = getattr(type(self.instance), call.method, None)
            if callable(method):
                prop = EndpointProperty(method, explicit_response_port=call.explicit)
        return prop

    def _prepare(
        self, call: Call, parts: Sequence[Buffer], context: Context
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        """The function to run for a call, and its arguments."""
        args, kwargs = loads_arguments(parts)
        prop = self._endpoint(call)
        if prop is None:
            raise AttributeError(f"{type(self.instance).__name__} has no endpoint {call.method!r}")
        if prop._explicit_response_port:
            from ._port import Port

            reply = call.reply
            rank = context.message_rank.rank
            port: Port[Any] | _DropPort = Port(reply, rank) if reply is not None else _DropPort()
            return _no_result(prop._method), (self.instance, port, *args), kwargs
        return prop._method, (self.instance, *args), kwargs

    def _conclude(
        self,
        call: Call,
        context: Context,
        result: Any,
        exc: BaseException | None,
        batch: list[Any] | None = None,
    ) -> None:
        """Reply with what a call returned or raised; what cannot go back fails the actor."""
        reply = call.reply
        rank = context.message_rank.rank
        if exc is None:
            if reply is not None and result is not _NO_RESULT:
                self._reply(reply, result, rank=rank, batch=batch)
            return
        if not isinstance(exc, Exception):  # SystemExit and the like fail the actor
            self._fail(exc, f"endpoint {call.method} raised {type(exc).__name__}")
            if reply is not None:
                self._refuse(call, batch)
            return
        prop = self._endpoint(call)
        explicit = prop is not None and prop._explicit_response_port
        if reply is not None and not (explicit and prop is not None and prop._concurrent):
            self._reply(reply, exc, error=True, rank=rank, batch=batch)
        else:
            self._fail(exc, f"endpoint {call.method} raised with nobody to tell")

    def _refuse(self, call: Call, batch: list[Any] | None = None) -> None:
        if call.reply is None:
            return
        if self.stopped is not None:
            why = f"actor {self.info.actor_id} was stopped: {self.stopped}"
        else:
            why = (
                f"actor {self.info.actor_id} and all its descendants have failed: {self.failure!r}"
            )
        rank = self._context_for(call).message_rank.rank
        self._reply(call.reply, SupervisionError(why), error=True, rank=rank, batch=batch)

    def _supervise_handler(
        self, failure: MeshFailure
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        if self.failure is not None or self.stopped is not None:
            raise _NoHandler
        handler = getattr(type(self.instance), "__supervise__", None)
        if handler is None:
            self._fail(failure, "it owns a failed mesh and has no __supervise__")
            raise _NoHandler
        return handler, (self.instance, failure), {}

    def _supervise_sync(self, failure: MeshFailure) -> None:
        _context.set(Context(self.info, self.rank))
        try:
            handled = self._call_sync(*self._supervise_handler(failure))
        except _NoHandler:
            return
        except Exception as exc:  # noqa: BLE001 - a raising handler fails its actor
            handled = exc
        self._supervised(failure, handled)

    def _supervised(self, failure: MeshFailure, handled: Any) -> None:
        """What ``__supervise__`` returned (or raised): a falsy value fails the actor."""
        if isinstance(handled, Exception):
            self._fail(handled, f"__supervise__ raised while handling {failure}")
        elif not handled:
            self._fail(failure, "__supervise__ did not handle a failure")

    def _fail(self, exc: BaseException, why: str) -> None:
        """The actor has failed (from any thread): it answers every later call with a
        SupervisionError, its owner hears of it, and the meshes it owns die with it."""
        if self.failure is not None:
            return
        self.failure = exc
        log.error("actor %s failed: %s", self.info.actor_id, why, exc_info=exc)
        reason = f"actor {self.info.actor_id} failed: {why}: {exc!r}"
        failed = ActorFailed(self.spawn.mesh, self.spawn.rank, reason)
        self.runtime.post(self.spawn.reply.proc, TO_PROC, "", failed)
        if self.owned:
            self.runtime.call_soon(
                self.runtime.spawn_task, self._stop_owned(f"owner {self.info.actor_id} failed")
            )

    async def _stop_owned(self, reason: str) -> None:
        owned, self.owned = self.owned, []
        for mesh in reversed(owned):
            try:
                await wait_outcome(mesh.stop(reason)._cf)
            except Exception:
                log.exception("stopping %r owned by %s failed", mesh, self.info.actor_id)

    def _reply_stopped(self, stop: Call) -> None:
        if stop.reply is not None:
            self._reply(stop.reply, None, rank=self._context_for(stop).message_rank.rank)

    def _reply(
        self,
        port: PortRef,
        value: Any,
        *,
        error: bool = False,
        rank: int = 0,
        batch: list[Any] | None = None,
    ) -> None:
        """Send a value or an error to a port (from any thread; see ``Runtime.post``)."""
        if error:
            value = _RemoteFailure.of(value, f"A remote actor call failed on {self.info.actor_id}")
        try:
            payload = dumps(value)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result fails the call
            problem = TypeError(f"cannot pickle the result of {self.info.actor_id}: {exc}")
            payload = dumps(_RemoteFailure.of(problem, "A remote actor call failed"))
            error = True
        self.runtime.send_to_port(port, PortValue(rank, error), payload, batch)


_spinning = 0
"""Sync actor threads of this process yielding while they wait (at most one)."""


def _await_message(calls: queue.SimpleQueue[Any]) -> None:
    """Yield the CPU a while (``wait_spin``) for the next message before sleeping on the
    queue: in a call-and-wait exchange it comes soon, and on an idle machine waking a
    sleeping thread costs a halted CPU's wake-up. One actor thread of a process at most,
    so that a cast to many actors of one process does not keep them all spinning."""
    global _spinning
    if _spinning:
        return
    spin = current_config().wait_spin
    if spin <= 0:
        return
    _spinning += 1
    try:
        deadline = time.perf_counter() + spin
        while calls.empty() and time.perf_counter() < deadline:
            os.sched_yield()
    finally:
        _spinning -= 1


def _is_async_fn(fn: Callable[..., Any]) -> bool:
    code = getattr(fn, "__code__", None)  # a plain function: one flag, no inspect call
    if code is not None and not hasattr(fn, "_is_coroutine_marker"):
        return bool(code.co_flags & inspect.CO_COROUTINE)
    return inspect.iscoroutinefunction(fn)


class _NoHandler(Exception):
    """No ``__supervise__`` runs (the actor is done, or has none and has failed)."""


_NO_RESULT: Any = object()
"""What an explicit-response endpoint returns: it replies through its port itself."""


def _no_result(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        async def run_async(*args: Any, **kwargs: Any) -> Any:
            await method(*args, **kwargs)
            return _NO_RESULT

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        method(*args, **kwargs)
        return _NO_RESULT

    return run


class _DropPort:
    """The port an explicit-response endpoint gets when the caller wants no reply."""

    def send(self, obj: object) -> None:
        pass

    def exception(self, exc: BaseException) -> None:
        pass


def refuse_undeliverable(runtime: Runtime, body: Body, dest: str) -> None:
    """A call for an actor this proc does not have: the caller must not wait forever."""
    if isinstance(body, Call) and body.reply is not None:
        error = SupervisionError(f"no actor {dest!r} on {runtime.address} (never spawned or gone)")
        failure = _RemoteFailure.of(error, "undeliverable message")
        runtime.send_to_port(body.reply, PortValue(0, True), dumps(failure))


class _LocalMesh:
    """The actors of one mesh that live in this process (several when procs share one).

    Takes the mesh's calls off the wire in sequence order per origin (see ``_cast``) and
    hands each to the local actors its shape covers. When a call gathers replies and
    covers several of them, their replies go back together (``_LocalGather``).
    """

    def __init__(self, runtime: Runtime, hosts: list[_ActorHost]) -> None:
        self.runtime = runtime
        self.hosts = hosts
        self.order = ReceiveOrder(
            self._dispatch,
            runtime.loop.call_later,
            lambda: current_config().message_delivery_timeout,
        )
        self._targets: dict[ShapeSpec, list[_ActorHost]] = {}

    def deliver(self, body: Body, payload: Sequence[Buffer], sender: str) -> None:
        if not isinstance(body, Call):
            return
        seq = body.seqs[0] if body.seqs else 0
        origin = body.origin or sender
        if self.order.is_next(origin, seq):  # the common case, in fewer steps
            self._dispatch((body, payload))
        else:
            self.order.accept(origin, seq, (body, payload))

    def _dispatch(self, item: tuple[Call, Sequence[Buffer]]) -> None:
        call, payload = item
        hosts = self.hosts
        if len(hosts) > 1:
            hosts = self._covered(call.shape)
            if len(hosts) > 1 and call.gather and call.reply is not None:
                gather = _LocalGather(self.runtime, call.reply, len(hosts))
                call = msgspec.structs.replace(call, reply=gather.port)
        for host in hosts:
            host.enqueue(call, payload)

    def _covered(self, spec: ShapeSpec) -> list[_ActorHost]:
        covered = self._targets.get(spec)
        if covered is None:
            if len(self._targets) >= 64:
                self._targets.clear()
            ndslice = _shape_of(spec).ndslice
            covered = self._targets[spec] = [h for h in self.hosts if h.spawn.rank in ndslice]
        return covered


class _LocalGather:
    """Collects the replies of this process's actors to one call; sends them on as one
    PortBatch, each distinct value once (replies of identical values are stored once)."""

    __slots__ = ("count", "groups", "port", "reply", "runtime")

    def __init__(self, runtime: Runtime, reply: PortRef, count: int) -> None:
        self.runtime = runtime
        self.reply = reply
        self.count = count
        self.groups: dict[Any, tuple[list[int], bool, Sequence[Buffer]]] = {}
        self.port = runtime.open_port(self)

    def __call__(self, body: Body, payload: Sequence[Buffer]) -> None:
        if not isinstance(body, PortValue):
            return
        # A value that is one small pickle is grouped with identical ones.
        key: Any = (body.error, bytes(payload[0])) if len(payload) == 1 else object()
        group = self.groups.get(key)
        if group is None:
            self.groups[key] = ([body.rank], body.error, payload)
        else:
            group[0].append(body.rank)
        self.count -= 1
        if self.count == 0:
            self.runtime.close_port(self.port)
            groups = tuple((tuple(r), e, len(p)) for r, e, p in self.groups.values())
            parts = [part for _, _, p in self.groups.values() for part in p]
            self.runtime.send_to_port(self.reply, PortBatch(groups), parts)


def handle_spawn_actor(
    runtime: Runtime, body: SpawnActor, payload: Sequence[Buffer], sender: str
) -> None:
    hosts = [
        _ActorHost(runtime, msgspec.structs.replace(body, rank=rank, ranks=()), payload)
        for rank in (body.ranks or (body.rank,))
    ]
    for host in hosts:
        _live_hosts[host.info.actor_id] = host
    runtime.add_actor(body.mesh, _LocalMesh(runtime, hosts).deliver)


_live_hosts: dict[str, _ActorHost] = {}
"""Actors of this process by actor id, for ``Instance.stop``/``abort``."""


# -- the caller side -------------------------------------------------------------------


class _Gather:
    """Collects one reply per rank of a cast on a port; fails fast on errors or dead procs.

    When done it completes ``result`` (a call's future: its one value, or a ValueMesh
    over ``mesh``) or calls ``on_done``. One object per call in flight, itself the
    port's handler: thousands may be pending at once.
    """

    __slots__ = (
        "_done",
        "_outcome",
        "arrivals",
        "count",
        "mesh",
        "on_done",
        "port",
        "received",
        "result",
        "runtime",
        "values",
        "want",
        "watches",
    )

    def __init__(
        self,
        runtime: Runtime,
        count: int,
        procs: Iterable[str],
        *,
        stream: bool = False,
        on_done: Callable[[list[Any] | None, BaseException | None], None] | None = None,
        result: Future[Any] | None = None,
        want: str = "",
        mesh: ActorMesh[Any] | None = None,
    ) -> None:
        self.runtime = runtime
        self.count = count
        self.on_done = on_done
        self.result = result
        self.want = want
        self.mesh = mesh
        self.values: list[Any] = [None] * count
        self.received = 0
        self._done: asyncio.Future[list[Any]] | None = None
        self._outcome: tuple[list[Any] | None, BaseException | None] | None = None
        self.arrivals: list[asyncio.Future[Any]] | None = (
            [runtime.loop.create_future() for _ in range(count)] if stream else None
        )
        self.port = runtime.open_port(self)
        self.watches = [(proc, runtime.watch_peer(proc, self._on_peer_lost)) for proc in procs]
        if result is not None:
            result._answering = len(self.watches)

    def __call__(self, body: Body, payload: Sequence[Buffer]) -> None:
        """A value for the port, or a batch of them (each distinct value unpickled once)."""
        if isinstance(body, PortValue):
            self._accept((body.rank,), *self._read(body.error, payload))
        elif isinstance(body, PortBatch):
            at = 0
            for ranks, error, count in body.groups:
                if self._outcome is not None:
                    return
                self._accept(ranks, *self._read(error, payload[at : at + count]))
                at += count

    @staticmethod
    def _read(error: bool, payload: Sequence[Buffer]) -> tuple[Any, bool]:
        try:
            value = loads(payload)
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be read fails the call
            return exc, True
        if error and isinstance(value, _RemoteFailure):
            value = value.to_error()
        return value, error

    def _accept(self, ranks: Sequence[int], value: Any, error: bool) -> None:
        if self.arrivals is not None:
            for _ in ranks:
                slot = self.arrivals[self.received]
                (slot.set_exception if error else slot.set_result)(value)
                self.received += 1
            if self.received == self.count:
                self._finish(None)
            return
        if error:
            self._finish(value)
            return
        values = self.values
        for rank in ranks:
            values[rank] = value
        self.received += len(ranks)
        if self.received == self.count:
            self._finish(None)

    def _on_peer_lost(self, address: str, exc: BaseException) -> None:
        error = SupervisionError(
            f"the proc at {address} and all its descendants have failed: {exc}"
        )
        if self.arrivals is not None:
            for slot in self.arrivals:
                if not slot.done():
                    slot.set_exception(error)
        self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        if self._outcome is not None:
            return
        values = self.values
        self._outcome = (None, error) if error is not None else (values, None)
        runtime = self.runtime
        runtime.close_port(self.port)
        for proc, key in self.watches:
            runtime.unwatch_peer(proc, key)
        result = self.result
        if result is not None and not result.done():
            if error is not None:
                result.set_exception(error)
            elif self.want == "one":
                result.set_result(values[0])
            else:
                assert self.mesh is not None
                result.set_result(ValueMesh(self.mesh._shape_for_values(), values))
        if self.on_done is not None:
            self.on_done(None if error is not None else values, error)
        if self._done is not None:
            self._settle(self._done)

    @property
    def done(self) -> asyncio.Future[list[Any]]:
        """The values, as an asyncio future of the loop (made when first asked for)."""
        if self._done is None:
            self._done = self.runtime.loop.create_future()
            if self._outcome is not None:
                self._settle(self._done)
        return self._done

    def _settle(self, done: asyncio.Future[list[Any]]) -> None:
        assert self._outcome is not None
        values, error = self._outcome
        if error is not None:
            done.set_exception(error)
            done.exception()  # observed here; on_done or an awaiter reports it
        else:
            assert values is not None
            done.set_result(values)


class Endpoint(Generic[R]):
    """An endpoint of an actor mesh, with the messaging adverbs."""

    def __init__(self, mesh: ActorMesh[Any], name: str, prop: EndpointProperty[R]) -> None:
        self._mesh = mesh
        self._name = name
        self._prop = prop

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"endpoint {self._name}() is called through an adverb: "
            f".call(), .call_one(), .choose(), .stream() or .broadcast()"
        )

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Buffer]:
        """The pickled arguments, once they are known to fit the endpoint's signature."""
        prop = self._prop
        arity = prop._arity
        leading = 2 if prop._explicit_response_port else 1  # self, and the port
        if kwargs or arity is None or not arity[0] <= len(args) + leading <= arity[1]:
            try:
                prop._signature.bind(*(None,) * leading, *args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{self._name}() {exc}") from None
        return dumps_arguments(args, kwargs)

    def _submit(self, mesh: ActorMesh[Any], payload: list[Buffer], want: str) -> Future[Any]:
        explicit = self._prop._explicit_response_port
        procs = mesh._cast_here() if want != "stream" else None
        if procs is None:
            return submit_into(
                mesh._runtime, ActorMesh._start_cast, mesh, self._name, payload, want, explicit
            )
        future: Future[Any] = Future._new()
        mesh._cast_gathering(procs, self._name, payload, want, explicit, future)
        return future

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor of the (sliced) mesh; gather one value per rank."""
        return self._submit(self._mesh, self._bind(args, kwargs), "mesh")

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of a mesh of one."""
        size = len(self._mesh._shape.ndslice)
        if size != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {size}")
        return self._submit(self._mesh, self._bind(args, kwargs), "one")

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of the mesh, chosen uniformly at random."""
        payload = self._bind(args, kwargs)
        return self._submit(_choose_one(self._mesh), payload, "one")

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """One future per rank, in arrival order."""
        arrivals: list[asyncio.Future[Any]] = self._submit(
            self._mesh, self._bind(args, kwargs), "stream"
        ).get()
        runtime = self._mesh._runtime
        return iter([run_on(runtime, _await(arrival)) for arrival in arrivals])

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Fire and forget to every actor of the mesh."""
        payload = self._bind(args, kwargs)
        self._mesh._send_cast(self._name, payload, None, self._prop._explicit_response_port)

    def _send(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Any = None,
        selection: str = "all",
    ) -> None:
        payload = self._bind(args, kwargs)
        mesh = self._mesh
        if selection == "choose":
            mesh = _choose_one(mesh)
        elif selection != "all":
            raise ValueError(f"selection must be 'all' or 'choose', not {selection!r}")
        reply = port._ref if port is not None else None
        mesh._send_cast(self._name, payload, reply, self._prop._explicit_response_port)


async def _await(future: asyncio.Future[Any]) -> Any:
    return await future


class NotAnEndpoint:
    """A plain method of a spawned actor: call it through ``as_endpoint``."""

    def __init__(self, mesh: ActorMesh[Any], name: str) -> None:
        self._mesh = mesh
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self._name}() is not annotated as an endpoint of "
            f"{self._mesh._class.__name__}; use @endpoint or as_endpoint()"
        )


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> Endpoint[Any]:
    """Call a plain method of a spawned actor as if it were an endpoint."""
    if isinstance(not_an_endpoint, Endpoint):
        return not_an_endpoint
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise TypeError(f"as_endpoint() takes mesh.method, not {not_an_endpoint!r}")
    mesh = not_an_endpoint._mesh
    method = getattr(mesh._class, not_an_endpoint._name)
    prop: EndpointProperty[Any] = EndpointProperty(
        method, propagate=propagate, explicit_response_port=explicit_response_port
    )
    return Endpoint(mesh, not_an_endpoint._name, prop)


def send(
    endpoint: Endpoint[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Any = None,
    selection: str = "all",
) -> None:
    """Low-level cast: each rank's reply goes to ``port`` (none if ``None``)."""
    endpoint._send(args, kwargs, port, selection)


class Accumulator(Generic[R, A]):
    """Folds an endpoint's per-rank results with ``combine``, starting from ``identity``."""

    def __init__(self, endpoint: Endpoint[R], identity: A, combine: Callable[[A, R], A]) -> None:
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        futures = list(self._endpoint.stream(*args, **kwargs))

        async def fold() -> A:
            value = self._identity
            for future in futures:
                value = self._combine(value, await future)
            return value

        return run_on(self._endpoint._mesh._runtime, fold())


def _choose_one(mesh: ActorMesh[R]) -> ActorMesh[R]:
    """One actor of the mesh, chosen uniformly at random, keeping the mesh's dimensions."""
    shape = mesh._shape
    rank = shape.ndslice[random.randrange(len(shape.ndslice))]
    labels = list(shape.labels)
    return mesh._with_shape(
        Shape(labels, NDSlice(rank, [1] * len(labels), list(shape.ndslice.strides)))
    )


class _MeshState:
    """What every slice of one actor mesh shares: addresses once known, casts until then.

    Casts made before the procs are up wait in ``backlog`` and go out in the order
    they were made, after the spawn messages, so FIFO per sender holds from the start.
    Only touched on the runtime loop.
    """

    def __init__(
        self, runtime: Runtime, addresses: list[str] | None, procs: Procs | None = None
    ) -> None:
        self.runtime = runtime
        self.procs = procs
        self.addresses = addresses
        """Known at once for a mesh received in a message; after the spawn otherwise."""
        self.error: BaseException | None = None
        self.stopped: str | None = None
        self.backlog: deque[Callable[[list[str] | BaseException], None]] = deque()
        self.spawn_gather: _Gather | None = None
        self.supervised: _Supervised | None = None
        """Set in the process that spawned the mesh: who owns it, and what failed."""

    def known_addresses(self) -> list[str]:
        """The addresses for pickling a mesh that may still be starting.

        Waits for the procs (not for the spawn) when it may block: a receiver's
        calls that overtake the spawn are held by the target proc until it arrives.
        """
        procs = self.procs
        if procs is None:
            raise TypeError("an ActorMesh with no procs cannot be sent")
        if not isinstance(procs, Outcome):
            return list(procs)
        if not procs.done() and self.runtime.on_loop():
            raise TypeError(
                "an ActorMesh whose procs are still starting cannot be sent from inside "
                "an async endpoint; await mesh.initialized first"
            )
        return list(procs._wait())

    def wait_for(self, procs: Procs, posted: Outcome[_Gather] | None) -> None:
        async def wait() -> None:
            try:
                if posted is not None:
                    self.spawn_gather = await wait_outcome(posted)
                self.addresses = await resolve(procs)
            except Exception as exc:  # noqa: BLE001 - every waiting cast fails with it
                self.error = exc
            if self.supervised is not None and self.addresses is not None:
                self.supervised.watch(self.addresses)
            while self.backlog:
                self.backlog.popleft()(self.addresses or self.error or RuntimeError("no procs"))

        self.runtime.spawn_task(wait())

    def when_ready(self, then: Callable[[list[str] | BaseException], None]) -> None:
        if self.stopped is not None:
            then(SupervisionError(f"the actor mesh was stopped: {self.stopped}"))
        elif self.addresses is not None:
            then(self.addresses)
        elif self.error is not None:
            then(self.error)
        else:
            self.backlog.append(then)


class _Supervised:
    """The spawner's view of an actor mesh it owns: failures go to its owner.

    ``owner`` is the actor whose code spawned the mesh, or ``None`` for the client
    (the root). Each rank's failure is reported once; none after a deliberate stop.
    """

    def __init__(
        self,
        state: _MeshState,
        owner: _ActorHost | None,
        cls: type,
        mesh_id: str,
        name: str,
        shape: Shape,
    ) -> None:
        self.state = state
        self.owner = owner
        self.cls = cls
        self.mesh_id = mesh_id
        self.name = name
        self.shape = shape
        self.failed: set[int] = set()
        _supervised[mesh_id] = self

    def watch(self, addresses: list[str]) -> None:
        """Hear at once when a proc under the mesh dies (the connection to it closes)."""
        runtime = self.state.runtime
        for address in {addresses[rank] for rank in self.shape.ndslice}:
            if address != runtime.address:
                ranks = [r for r in self.shape.ndslice if addresses[r] == address]
                runtime.watch_peer(address, self._lost(ranks))

    def _lost(self, ranks: list[int]) -> Callable[[str, BaseException], None]:
        def lost(address: str, exc: BaseException) -> None:
            self.fail(ranks, f"the proc at {address} failed: {exc}")

        return lost

    def fail(self, ranks: Sequence[int], event: str) -> None:
        if self.state.stopped is not None:
            return
        new = [rank for rank in ranks if rank not in self.failed]
        if not new:
            return
        self.failed.update(new)
        positions = [self.shape.ndslice.index(rank) for rank in new]
        mesh: ActorMesh[Any] = ActorMesh(self.cls, self.mesh_id, self.name, self.shape, self.state)
        failure = MeshFailure(self.name, positions, event, mesh)
        if self.owner is not None:
            self.owner.supervise(failure)
        else:  # the root: nobody above to handle it
            try:
                self.state.runtime.loop.run_in_executor(None, call_fault_hook, failure)
            except RuntimeError:  # the interpreter is exiting: nobody to tell but the log
                log.warning("at exit: %s", failure.report())


_supervised: dict[str, _Supervised] = {}


def handle_actor_failed(
    runtime: Runtime, body: ActorFailed, payload: Sequence[Buffer], sender: str
) -> None:
    supervised = _supervised.get(body.mesh)
    if supervised is not None:
        supervised.fail([body.rank], body.reason)


class ActorMesh(ShapedMesh, Generic[R]):
    """The actors of one spawn, one per proc of a ProcMesh; endpoints are attributes."""

    def __init__(
        self,
        cls: type,
        mesh_id: str,
        name: str,
        shape: Shape,
        state: _MeshState,
    ) -> None:
        self._class = cls
        self._mesh_id = mesh_id
        self._name = name
        self._shape = shape
        self._state = state
        self._runtime = state.runtime
        self._plan: tuple[list[str], list[int], ShapeSpec, list[str]] | None = None
        self._values_shape: Shape | None = None
        for ep_name, prop in _endpoints(cls).items():  # names checked by spawn_actor_mesh
            setattr(self, ep_name, Endpoint(self, ep_name, prop))

    # MeshTrait hook
    def _new_with_shape(self, shape: Shape) -> ActorMesh[R]:
        return self._with_shape(shape)

    def _with_shape(self, shape: Shape) -> ActorMesh[R]:
        return ActorMesh(self._class, self._mesh_id, self._name, shape, self._state)

    def __getattr__(self, name: str) -> Any:
        cls = self.__dict__.get("_class")
        if cls is not None and not name.startswith("__") and callable(getattr(cls, name, None)):
            return NotAnEndpoint(self, name)
        raise AttributeError(f"{type(self).__name__} has no endpoint or attribute {name!r}")

    # -- casting ------------------------------------------------------------------------

    def _cast_here(self) -> list[str] | None:
        """The mesh's procs, when the calling thread may cast to it itself, without a
        hop through the runtime loop: the procs are known, and nothing the caller asked
        the loop for earlier (a cast waiting for the procs, a stop) can be overtaken."""
        state = self._state
        addresses = state.addresses
        if addresses is None or state.stopped is not None or state.backlog:
            return None
        return addresses if self._runtime.idle() else None

    def _send_cast(
        self, method: str, payload: Sequence[Buffer], reply: PortRef | None, explicit: bool
    ) -> None:
        """Cast with no gathering (broadcast, send): from this thread when it may (see
        ``_cast_here``), else in order through the runtime loop."""
        procs = self._cast_here()
        if procs is not None:
            self._post_to(procs, method, payload, reply, explicit)
        else:
            self._runtime.call_soon(self._post_cast, method, payload, reply, explicit)

    def _post_cast(
        self, method: str, payload: Sequence[Buffer], reply: PortRef | None, explicit: bool
    ) -> None:
        """Post one Call per proc of the (sliced) mesh, in order with earlier casts."""

        def go(ready: list[str] | BaseException) -> None:
            if isinstance(ready, BaseException):
                log.warning("dropped %s() cast: %s", method, ready)
                return
            self._post_to(ready, method, payload, reply, explicit)

        self._state.when_ready(go)

    def _post_to(
        self,
        procs: list[str],
        method: str,
        payload: Sequence[Buffer],
        reply: PortRef | None,
        explicit: bool = False,
        gather: bool = False,
    ) -> None:
        """One message per process hosting part of the (sliced) mesh, down the cast tree."""
        runtime = self._runtime
        _, spec, targets = self._cast_plan(procs)
        seqs = runtime.send_order.take(self._mesh_id, targets)
        call = Call(
            self._mesh_id,
            method,
            spec,
            reply,
            explicit,
            runtime.incarnation,
            seqs,
            (),
            gather and not explicit,
        )
        runtime.cast(targets, self._mesh_id, call, payload)

    def _cast_plan(self, procs: list[str]) -> tuple[list[int], ShapeSpec, list[str]]:
        """The ranks this (sliced) mesh covers, its shape on the wire, and the processes
        hosting them in rank order (computed once: a cast costs O(processes))."""
        plan = self._plan
        if plan is None or plan[0] is not procs:
            ranks = list(self._shape.ndslice)
            targets = list(dict.fromkeys(procs[rank] for rank in ranks))
            plan = self._plan = (procs, ranks, _shape_spec(self._shape), targets)
        return plan[1], plan[2], plan[3]

    def _start_cast(
        self,
        method: str,
        payload: Sequence[Buffer],
        want: str,
        explicit: bool,
        result: Future[Any],
    ) -> None:
        """Post the cast now (or after earlier casts, once the procs are up); loop only.

        ``result`` is completed straight from the gathering port: no future in between.
        """

        def go(ready: list[str] | BaseException) -> None:
            if isinstance(ready, BaseException):
                result.set_exception(ready)
            else:
                self._cast_gathering(ready, method, payload, want, explicit, result)

        self._state.when_ready(go)

    def _cast_gathering(
        self,
        procs: list[str],
        method: str,
        payload: Sequence[Buffer],
        want: str,
        explicit: bool,
        result: Future[Any],
    ) -> None:
        ranks, _, targets = self._cast_plan(procs)
        if want == "stream":
            gather = _Gather(self._runtime, len(ranks), targets, stream=True)
            self._post_to(procs, method, payload, gather.port, explicit, True)
            result.set_result(gather.arrivals)
            return
        gather = _Gather(self._runtime, len(ranks), targets, result=result, want=want, mesh=self)
        self._post_to(procs, method, payload, gather.port, explicit, True)

    def _shape_for_values(self) -> Shape:
        """The shape of a gathered ValueMesh: this mesh's, its ranks renumbered from 0."""
        shape = self._values_shape
        if shape is None:
            shape = self._values_shape = Shape(
                list(self._shape.labels), NDSlice.new_row_major(list(self._shape.ndslice.sizes))
            )
        return shape

    @property
    def initialized(self) -> Future[None]:
        """Completes when every actor's ``__init__`` has run (raises if one failed)."""

        async def wait() -> None:
            started: asyncio.Future[None] = self._runtime.loop.create_future()
            self._state.when_ready(
                lambda ready: (
                    started.set_exception(ready)
                    if isinstance(ready, BaseException)
                    else started.set_result(None)
                )
            )
            await started
            if self._state.spawn_gather is not None:
                await self._state.spawn_gather.done

        return run_on(self._runtime, wait())

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Drain and stop every actor of the mesh (``__cleanup__`` runs); later calls fail."""
        return submit_into(self._runtime, self._start_stop, reason)

    def _start_stop(self, reason: str, result: Future[None]) -> None:
        def finish(values: list[Any] | None, error: BaseException | None) -> None:
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(None)

        def go(ready: list[str] | BaseException) -> None:
            if isinstance(ready, BaseException):
                result.set_result(None)  # never started: nothing to stop
                return
            ranks, _, targets = self._cast_plan(ready)
            gather = _Gather(self._runtime, len(ranks), targets, on_done=finish)
            self._post_to(ready, STOP_METHOD, dumps(reason), gather.port, gather=True)

        self._state.when_ready(go)
        self._state.stopped = reason

    def __reduce__(self) -> Any:
        addresses = self._state.addresses or self._state.known_addresses()
        spec = _shape_spec(self._shape)
        return (_rebuild_actor_mesh, (self._class, self._mesh_id, self._name, addresses, spec))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name} of {self._class.__name__} {self._shape.extent!r}>"


_RESERVED = frozenset(dir(ActorMesh)) | {
    "_class",
    "_mesh_id",
    "_name",
    "_shape",
    "_state",
    "_plan",
    "_values_shape",
}


def _check_endpoint_names(cls: type) -> None:
    """Endpoints become attributes of the mesh: one named like a mesh attribute is refused
    before anything is spawned."""
    for name in _endpoints(cls):
        if name in _RESERVED:
            raise ValueError(
                f"endpoint {name!r} of {cls.__name__} collides with an ActorMesh attribute"
            )


def _rebuild_actor_mesh(
    cls: type, mesh_id: str, name: str, procs: list[str], spec: ShapeSpec
) -> ActorMesh[Any]:
    state = _MeshState(current_runtime(), procs)
    return ActorMesh(cls, mesh_id, name, _shape_of(spec), state)


Procs = Sequence[str] | Outcome[list[str]]
"""Proc addresses by rank, or the future of them while the procs start."""


async def resolve(procs: Procs) -> list[str]:
    if isinstance(procs, Outcome):
        pending: Outcome[Any] = procs
        return list(await wait_outcome(pending))
    return list(procs)


def spawn_actor_mesh(
    runtime: Runtime,
    name: str,
    cls: object,
    procs: Procs,
    shape: Shape,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> ActorMesh[Any]:
    """Spawn ``cls`` on every proc; returns at once, the actors start in the background."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ValueError(f"{cls!r} is not an Actor subclass")
    _actor_is_async(cls)  # raises on mixed endpoints
    _check_endpoint_names(cls)
    payload = dumps((cls, args, kwargs))
    mesh_id = f"{name}-{uuid.uuid4().hex[:12]}"

    async def post() -> _Gather:
        addresses = await resolve(procs)
        hosted: dict[str, list[int]] = {}  # one spawn message per process, for its ranks
        for rank in shape.ndslice:
            hosted.setdefault(addresses[rank], []).append(rank)
        gather = _Gather(runtime, len(shape.ndslice), hosted)
        spec = _shape_spec(shape)
        for address, ranks in hosted.items():
            several = tuple(ranks) if len(ranks) > 1 else ()
            spawn = SpawnActor(mesh_id, name, ranks[0], spec, gather.port, several)
            runtime.post(address, TO_PROC, "", spawn, payload)
        return gather

    posted = run_on(runtime, post())._cf
    state = _MeshState(runtime, None, procs)
    owner = _host_var.get()
    state.supervised = _Supervised(state, owner, cls, mesh_id, name, shape)
    runtime.call_soon(state.wait_for, procs, posted)
    mesh: ActorMesh[Any] = ActorMesh(cls, mesh_id, name, shape, state)
    if owner is not None:
        owner.owned.append(mesh)
    return mesh
