"""Actors, endpoints and actor meshes: the user-facing half of messaging.

The caller side (``ActorMesh``, ``Endpoint`` adverbs) pickles arguments once per cast,
posts one message per destination proc, and gathers replies on a port into a
ValueMesh. The callee side (``_ActorHost``) runs one actor: one message at a time,
FIFO per sender, async endpoints on the proc's loop and sync endpoints on the
actor's own thread, so a long sync endpoint never stalls the proc.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import random
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from monarch.transport import Buffer

from ._future import Future, run_on
from ._messages import (
    TO_ACTOR,
    TO_PROC,
    Body,
    Call,
    PortRef,
    PortValue,
    ShapeSpec,
    SpawnActor,
    StopActor,
)
from ._runtime import Runtime, current_runtime
from ._serialize import dumps, loads
from ._shape import Extent, MeshTrait, NDSlice, Point, Shape
from ._value_mesh import ValueMesh

log = logging.getLogger("monarch.actor")

R = TypeVar("R")


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
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self._method)

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self._method.__get__(instance, owner)


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


@dataclass(frozen=True)
class Context:
    actor_instance: Instance
    message_rank: Point


_EMPTY_POINT = Point(0, Extent([], []))
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


class _ActorHost:
    """Runs one actor inside its proc."""

    def __init__(self, runtime: Runtime, spawn: SpawnActor, payload: Sequence[Buffer]) -> None:
        self.runtime = runtime
        self.spawn = spawn
        self.queue: asyncio.Queue[tuple[Call, Sequence[Buffer]]] = asyncio.Queue()
        self.failure: BaseException | None = None
        self.instance: Any = None
        shape = _shape_of(spawn.shape)
        self.rank = Point(shape.ndslice.index(spawn.rank), shape.extent)
        self.info = Instance(
            self.rank,
            spawn.name,
            "?",
            f"{runtime.address}/{spawn.mesh}[{self.rank.rank}]",
            runtime.address,
        )
        self.thread: concurrent.futures.ThreadPoolExecutor | None = None
        self.task = runtime.spawn_task(self.run(payload))

    def deliver(self, body: Body, payload: Sequence[Buffer], sender: str) -> None:
        if isinstance(body, Call):
            self.queue.put_nowait((body, payload))

    async def run(self, payload: Sequence[Buffer]) -> None:
        spawn = self.spawn
        try:
            cls, args, kwargs = loads(payload)
            self.info = Instance(
                self.rank, spawn.name, cls.__name__, self.info.actor_id, self.info.proc_id
            )
            self.is_async = _actor_is_async(cls)
            if not self.is_async:
                self.thread = concurrent.futures.ThreadPoolExecutor(1, f"actor-{spawn.name}")
            self.instance = await self._invoke(self.rank, cls, *args, **kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure in __init__ fails the actor
            self.failure = exc
            self._reply(spawn.reply, exc, error=True)
        else:
            self._reply(spawn.reply, None)
        while True:
            call, parts = await self.queue.get()
            await self.handle(call, parts)

    async def _invoke(
        self, message_rank: Point, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        ctx = contextvars.copy_context()
        ctx.run(_context.set, Context(self.info, message_rank))
        if inspect.iscoroutinefunction(fn):
            return await ctx.run(asyncio.ensure_future, fn(*args, **kwargs))
        if self.thread is None:
            return ctx.run(fn, *args, **kwargs)
        return await self.runtime.loop.run_in_executor(
            self.thread, functools.partial(ctx.run, fn, *args, **kwargs)
        )

    async def handle(self, call: Call, parts: Sequence[Buffer]) -> None:
        shape = _shape_of(call.shape)
        message_rank = Point(shape.ndslice.index(self.spawn.rank), shape.extent)
        if self.failure is not None:
            if call.reply is not None:
                error = SupervisionError(
                    f"actor {self.info.actor_id} and all its descendants have failed: "
                    f"{self.failure!r}"
                )
                self._reply(call.reply, error, error=True, rank=message_rank.rank)
            return
        try:
            args, kwargs = loads(parts)
            prop = _endpoints(type(self.instance)).get(call.method)
            if prop is None:
                raise AttributeError(
                    f"{type(self.instance).__name__} has no endpoint {call.method!r}"
                )
            result = await self._invoke(message_rank, prop._method, self.instance, *args, **kwargs)
        except Exception as exc:
            if call.reply is not None:
                self._reply(call.reply, exc, error=True, rank=message_rank.rank)
            else:
                log.error(
                    "endpoint %s of %s failed with no reply port",
                    call.method,
                    self.info.actor_id,
                    exc_info=exc,
                )
            return
        if call.reply is not None:
            self._reply(call.reply, result, rank=message_rank.rank)

    def _reply(self, port: PortRef, value: Any, *, error: bool = False, rank: int = 0) -> None:
        if error:
            value = _RemoteFailure(
                value,
                "".join(traceback.format_exception(type(value), value, value.__traceback__)),
                f"A remote actor call failed on {self.info.actor_id}",
            )
        try:
            payload = dumps(value)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result fails the call
            problem = TypeError(f"cannot pickle the result of {self.info.actor_id}: {exc}")
            payload = dumps(_RemoteFailure(problem, repr(problem), "A remote actor call failed"))
            error = True
        self.runtime.send_to_port(port, PortValue(rank, error), payload)


def handle_spawn_actor(
    runtime: Runtime, body: SpawnActor, payload: Sequence[Buffer], sender: str
) -> None:
    host = _ActorHost(runtime, body, payload)
    runtime.actors[body.mesh] = host.deliver
    _hosts[(id(runtime), body.mesh)] = host


def handle_stop_actor(
    runtime: Runtime, body: StopActor, payload: Sequence[Buffer], sender: str
) -> None:
    host = _hosts.pop((id(runtime), body.mesh), None)
    runtime.actors.pop(body.mesh, None)
    if host is not None:
        host.task.cancel()
        if host.thread is not None:
            host.thread.shutdown(wait=False)
    runtime.send_to_port(body.reply, PortValue(0), dumps(None))


_hosts: dict[tuple[int, str], _ActorHost] = {}


# -- the caller side -------------------------------------------------------------------


class _Gather:
    """Collects one reply per rank of a cast on a port; fails fast on errors or dead procs."""

    def __init__(
        self, runtime: Runtime, count: int, procs: set[str], *, stream: bool = False
    ) -> None:
        self.runtime = runtime
        self.count = count
        self.values: list[Any] = [None] * count
        self.received = 0
        self.done: asyncio.Future[list[Any]] = runtime.loop.create_future()
        self.arrivals: list[asyncio.Future[Any]] | None = (
            [runtime.loop.create_future() for _ in range(count)] if stream else None
        )
        self.port = runtime.open_port(self._on_value)
        self._unwatch = [runtime.watch_peer(proc, self._on_peer_lost) for proc in procs]

    def _on_value(self, body: Body, payload: Sequence[Buffer]) -> None:
        if not isinstance(body, PortValue):
            return
        try:
            value = loads(payload)
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be read fails the call
            value, error = exc, True
        else:
            error = body.error
            if error and isinstance(value, _RemoteFailure):
                value = value.to_error()
        if self.arrivals is not None:
            slot = self.arrivals[self.received]
            (slot.set_exception if error else slot.set_result)(value)
        elif error:
            self._finish(value)
            return
        self.values[body.rank] = value
        self.received += 1
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
        if self.done.done():
            return
        self.runtime.close_port(self.port)
        for unwatch in self._unwatch:
            unwatch()
        if error is not None:
            self.done.set_exception(error)
        else:
            self.done.set_result(self.values)


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
        try:
            self._prop._signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self._name}() {exc}") from None
        return dumps((args, kwargs))

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor of the (sliced) mesh; gather one value per rank."""
        payload = self._bind(args, kwargs)
        mesh = self._mesh
        return run_on(mesh._runtime.loop, mesh._cast(self._name, payload, want="mesh"))

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        size = len(self._mesh._shape.ndslice)
        if size != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {size}")
        payload = self._bind(args, kwargs)
        mesh = self._mesh
        return run_on(mesh._runtime.loop, mesh._cast(self._name, payload, want="one"))

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        payload = self._bind(args, kwargs)
        shape = self._mesh._shape
        position = random.randrange(len(shape.ndslice))
        mesh = self._mesh._with_shape(_select_position(shape, position))
        return run_on(mesh._runtime.loop, mesh._cast(self._name, payload, want="one"))

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """One future per rank, in arrival order."""
        payload = self._bind(args, kwargs)
        mesh = self._mesh
        arrivals: list[asyncio.Future[Any]] = run_on(
            mesh._runtime.loop, mesh._cast(self._name, payload, want="stream")
        ).get()
        loop = mesh._runtime.loop
        return iter(
            [Future._wrap(asyncio.run_coroutine_threadsafe(_await(a), loop)) for a in arrivals]
        )

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Fire and forget to every actor of the mesh."""
        payload = self._bind(args, kwargs)
        mesh = self._mesh
        mesh._runtime.loop.call_soon_threadsafe(mesh._post_cast, self._name, payload, None)

    def _send(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Any = None,
        selection: str = "all",
    ) -> None:
        raise NotImplementedError("send() with ports arrives with monarch-core's Channel support")


async def _await(future: asyncio.Future[Any]) -> Any:
    return await future


def _select_position(shape: Shape, position: int) -> Shape:
    rank = shape.ndslice[position]
    return Shape(
        list(shape.labels), NDSlice(rank, [1] * len(shape.labels), list(shape.ndslice.strides))
    )


class ActorMesh(MeshTrait, Generic[R]):
    """The actors of one spawn, one per proc of a ProcMesh; endpoints are attributes."""

    def __init__(
        self,
        cls: type,
        mesh_id: str,
        name: str,
        procs: Procs,
        shape: Shape,
        posted: concurrent.futures.Future[_Gather] | None,
        runtime: Runtime | None = None,
    ) -> None:
        self._class = cls
        self._mesh_id = mesh_id
        self._name = name
        self._procs = procs
        self._shape = shape
        self._posted = posted
        self._runtime = runtime or current_runtime()
        for ep_name, prop in _endpoints(cls).items():
            if ep_name in _RESERVED:
                raise ValueError(
                    f"endpoint {ep_name!r} of {cls.__name__} collides with an ActorMesh attribute"
                )
            setattr(self, ep_name, Endpoint(self, ep_name, prop))

    # MeshTrait hooks
    @property
    def _ndslice(self) -> NDSlice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels

    def _new_with_shape(self, shape: Shape) -> ActorMesh[R]:
        return self._with_shape(shape)

    def _with_shape(self, shape: Shape) -> ActorMesh[R]:
        return ActorMesh(
            self._class, self._mesh_id, self._name, self._procs, shape, self._posted, self._runtime
        )

    def __getattr__(self, name: str) -> Any:
        cls = self.__dict__.get("_class")
        if cls is not None and callable(getattr(cls, name, None)):
            raise RuntimeError(
                f"{name}() is not annotated as an endpoint of {cls.__name__}; "
                "use @endpoint or as_endpoint()"
            )
        raise AttributeError(name)

    async def _addresses(self) -> list[str]:
        if self._posted is not None:
            await asyncio.wrap_future(self._posted)
        return await resolve(self._procs)

    def _post_cast(
        self,
        method: str,
        payload: Sequence[Buffer],
        reply: PortRef | None,
        procs: list[str] | None = None,
    ) -> None:
        if procs is None:
            self._runtime.spawn_task(self._cast(method, payload, want=None))
            return
        call = Call(self._mesh_id, method, _shape_spec(self._shape), reply)
        for rank in self._shape.ndslice:
            self._runtime.post(procs[rank], TO_ACTOR, self._mesh_id, call, payload)

    async def _cast(self, method: str, payload: Sequence[Buffer], *, want: str | None) -> Any:
        procs = await self._addresses()
        if want is None:
            self._post_cast(method, payload, None, procs)
            return None
        targets = {procs[rank] for rank in self._shape.ndslice}
        gather = _Gather(self._runtime, len(self._shape.ndslice), targets, stream=want == "stream")
        self._post_cast(method, payload, gather.port, procs)
        if want == "stream":
            assert gather.arrivals is not None
            return gather.arrivals
        values = await gather.done
        if want == "one":
            return values[0]
        return ValueMesh(self._shape_for_values(), values)

    def _shape_for_values(self) -> Shape:
        return Shape(
            list(self._shape.labels), NDSlice.new_row_major(list(self._shape.ndslice.sizes))
        )

    @property
    def initialized(self) -> Future[None]:
        return run_on(self._runtime.loop, self._addresses_none())

    async def _addresses_none(self) -> None:
        if self._posted is not None:
            gather = await asyncio.wrap_future(self._posted)
            await gather.done

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        return run_on(self._runtime.loop, self._stop(reason))

    async def _stop(self, reason: str) -> None:
        procs = await self._addresses()
        targets = sorted({procs[rank] for rank in self._shape.ndslice})
        gather = _Gather(self._runtime, len(targets), set(targets))
        for proc in targets:
            self._runtime.post(proc, TO_PROC, "", StopActor(self._mesh_id, reason, gather.port))
        await gather.done

    def __reduce__(self) -> Any:
        if isinstance(self._procs, concurrent.futures.Future):
            if not self._procs.done():
                raise TypeError("an ActorMesh whose procs are not yet running cannot be sent")
            procs = self._procs.result()
        else:
            procs = list(self._procs)
        spec = _shape_spec(self._shape)
        return (_rebuild_actor_mesh, (self._class, self._mesh_id, self._name, procs, spec))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name} of {self._class.__name__} {self._shape.extent!r}>"


_RESERVED = frozenset(dir(ActorMesh)) | {
    "_class",
    "_mesh_id",
    "_name",
    "_procs",
    "_shape",
    "_posted",
    "_runtime",
}


def _rebuild_actor_mesh(
    cls: type, mesh_id: str, name: str, procs: list[str], spec: ShapeSpec
) -> ActorMesh[Any]:
    return ActorMesh(cls, mesh_id, name, procs, _shape_of(spec), None)


Procs = Sequence[str] | concurrent.futures.Future[list[str]]
"""Proc addresses by rank, or the future of them while the procs start."""


async def resolve(procs: Procs) -> list[str]:
    if isinstance(procs, concurrent.futures.Future):
        pending: concurrent.futures.Future[Any] = procs
        return list(await asyncio.wrap_future(pending))
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
    payload = dumps((cls, args, kwargs))
    mesh_id = f"{name}-{uuid.uuid4().hex[:12]}"

    async def post() -> _Gather:
        addresses = await resolve(procs)
        gather = _Gather(runtime, len(shape.ndslice), {addresses[r] for r in shape.ndslice})
        spec = _shape_spec(shape)
        for rank in shape.ndslice:
            spawn = SpawnActor(mesh_id, name, rank, spec, gather.port)
            runtime.post(addresses[rank], TO_PROC, "", spawn, payload)
        return gather

    posted = asyncio.run_coroutine_threadsafe(post(), runtime.loop)
    return ActorMesh(cls, mesh_id, name, procs, shape, posted, runtime)
