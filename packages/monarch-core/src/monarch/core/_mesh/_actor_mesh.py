"""The caller side: actor meshes and the adverbs of their endpoints.

An ``ActorMesh`` is the actors of one spawn; each endpoint is an ``Endpoint`` attribute
with the adverbs (``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``; ``send``
and ``Accumulator`` beside them). A cast pickles its arguments once, posts one message per
process hosting part of the (sliced) mesh down the cast tree (from the caller's own thread
when it may: ``_cast_here``), and gathers replies on a port (``_gather``). The spawner of a
mesh also supervises it: a failed actor or a dead proc becomes a ``MeshFailure`` for the
mesh's owner (``_spawn_actors``); what the spawner knows of the mesh's procs is its
``_MeshState`` (``_mesh_state``).

To add an adverb: a method of ``Endpoint``, built on ``_submit`` (gathered) or
``ActorMesh._send_cast`` (no replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from monarch._wheels import install_hint
from monarch.core._config import current_config
from monarch.core._errors import SupervisionError
from monarch.core._layout._shape import NDSlice, Shape, ShapedMesh
from monarch.core._layout._value_mesh import ValueMesh
from monarch.core._payload._filling import deferred_fills
from monarch.core._payload._filling import settle as settle_fills
from monarch.core._payload._serialize import dumps, dumps_call_arguments, size_of
from monarch.core._placement import hosting
from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._instrument import outgoing
from monarch.core._runtime._messages import (
    STOP_METHOD,
    Call,
    PortRef,
    ShapeSpec,
    shape_of,
    shape_spec,
)
from monarch.transport import Buffer, plugin_group

from ._endpoint import EndpointProperty, endpoints_of, misnamed_keyword
from ._future import Future, Outcome, run_on, submit_into
from ._gather import Gather, SharedWatch
from ._mesh_state import _MeshState, connection_lost, when_proc_ended
from ._pending import ProcsRef
from ._reports import (
    ACTOR_MESH_STOPPED,
    ROOT,
    endpoint,
    oversize,
    status_event,
    undeliverable,
)

log = logging.getLogger("monarch.actor")

R = TypeVar("R")
A = TypeVar("A")


_ADVERBS = {"mesh": "call", "one": "call_one"}
"""Upstream's names of the adverbs, by what ``Endpoint._submit`` wants gathered."""


TENSOR_ENGINE_GROUP = "monarch.tensor_engine"
"""Entry-point group of the tensor engine's methods of the core's classes:
``activate(proc_mesh)``, ``rank_tensor(proc_mesh, dim)``, ``rank_tensors(proc_mesh)``,
``rref(endpoint, args, kwargs)``."""

_tensor_engine: dict[str, Callable[..., Any]] = {}
"""The loaded entry points by name: looking one up reads every installed distribution's
metadata (~10 ms), too slow to repeat at each ``activate()``."""


def tensor_engine_entry(name: str, owner: str = "ProcMesh") -> Callable[..., Any]:
    """The tensor engine's ``name``, found once; an ImportError naming the wheel if absent."""
    found = _tensor_engine.get(name)
    if found is None:
        group = plugin_group(TENSOR_ENGINE_GROUP, {name: "monarch-tensor"}, hint=install_hint)
        found = _tensor_engine[name] = group.load(name, needed_by=f"{owner}.{name}()")
    return found


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

    def rref(self, *args: Any, **kwargs: Any) -> Any:
        """Upstream's ``rref``: inside ``proc_mesh.activate()``, each actor runs the endpoint
        in order with the tensor engine's operations and its result becomes a distributed
        tensor (one shard per proc; shapes from the endpoint's ``propagate``). The engine is
        monarch-tensor's, through the ``monarch.tensor_engine`` entry points."""
        return tensor_engine_entry("rref", "Endpoint")(self, args, kwargs)

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Buffer]:
        """The pickled arguments, once they are known to fit the endpoint's signature."""
        prop = self._prop
        arity = prop._arity
        leading = 2 if prop._explicit_response_port else 1  # self, and the port
        if kwargs or arity is None or not arity[0] <= len(args) + leading <= arity[1]:
            try:
                prop._signature.bind(*(None,) * leading, *args, **kwargs)
            except TypeError as exc:
                why = misnamed_keyword(prop._signature, kwargs) or exc
                raise TypeError(f"{self._name}() {why}") from None
        return dumps_call_arguments(self._name, args, kwargs, self._mesh)

    def _oversize(self, payload: list[Buffer], adverb: str) -> SupervisionError | None:
        """The error of a message larger than ``codec_max_frame_length``, which is not sent."""
        limit = current_config().codec_max_frame_length
        first = payload[0]
        if len(payload) == 1 and type(first) is bytes and len(first) <= limit:  # at once
            return None
        size = size_of(payload)
        if size <= limit:
            return None
        name = self._mesh._name
        adverb = _ADVERBS.get(adverb, adverb)
        text = undeliverable(name, self._name, adverb, oversize(size, limit))
        return SupervisionError(text, endpoint(name, self._name))

    def _submit(self, mesh: ActorMesh[Any], payload: list[Buffer], want: str) -> Future[Any]:
        error = self._oversize(payload, want)
        if error is not None:
            failed: Future[Any] = Future._new()
            failed.set_exception(error)
            return failed
        explicit = self._prop._explicit_response_port
        trace = outgoing(mesh._name, self._name, mesh._mesh_id, mesh._shape)
        procs = mesh._cast_here() if want != "stream" else None
        if procs is None:
            settle_fills()  # handed to the loop: as it is at the call
            start, name = ActorMesh._start_cast, self._name
            return submit_into(mesh._runtime, start, mesh, name, payload, want, explicit, trace)
        future: Future[Any] = Future._new()
        mesh._cast_gathering(procs, self._name, payload, want, explicit, future, trace)
        return future

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor of the (sliced) mesh; gather one value per rank."""
        with deferred_fills:
            return self._submit(self._mesh, self._bind(args, kwargs), "mesh")

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of a mesh of one."""
        size = len(self._mesh._shape.ndslice)
        if size != 1:
            raise ValueError(f"call_one requires exactly 1 actor, but mesh has {size}")
        with deferred_fills:
            return self._submit(self._mesh, self._bind(args, kwargs), "one")

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of the mesh, chosen uniformly at random."""
        with deferred_fills:
            payload = self._bind(args, kwargs)
            return self._submit(_choose_one(self._mesh), payload, "one")

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """One future per rank, in arrival order. Never waits (an async endpoint may stream:
        ``for f in mesh.ep.stream(): await f``); the futures follow the replies as they come."""
        mesh = self._mesh
        futures: list[Future[R]] = [Future._new() for _ in range(len(mesh._shape.ndslice))]
        submitted = self._submit(mesh, self._bind(args, kwargs), "stream")
        submitted.add_done_callback(functools.partial(_follow_arrivals, mesh._runtime, futures))
        return iter(futures)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Fire and forget to every actor of the mesh."""
        with deferred_fills:
            payload = self._bind(args, kwargs)
            if (error := self._oversize(payload, "broadcast")) is not None:
                raise error
            self._mesh._send_cast(self._name, payload, None, self._prop._explicit_response_port)

    def _send(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Any = None,
        selection: str = "all",
    ) -> None:
        given: object = selection
        if not isinstance(given, str):  # upstream's words for both mistakes
            kind = type(given).__name__
            raise TypeError(f"argument 'selection': '{kind}' object cannot be cast as 'str'")
        if selection not in ("all", "choose"):
            raise ValueError(f"Invalid selection: {selection}")
        with deferred_fills:
            payload = self._bind(args, kwargs)
            if (error := self._oversize(payload, "send")) is not None:
                raise error
            mesh = self._mesh
            if selection == "choose":
                mesh = _choose_one(mesh)
            reply = port._ref if port is not None else None
            mesh._send_cast(self._name, payload, reply, self._prop._explicit_response_port)


def _follow_arrivals(
    runtime: Runtime, futures: list[Future[Any]], submitted: Outcome[list[asyncio.Future[Any]]]
) -> None:
    """Each arrival of a stream, once the cast went out, completes the future of its place."""
    try:
        arrivals = submitted._wait()
    except BaseException as exc:  # noqa: BLE001 - the cast failed: every place fails with it
        for future in futures:
            future.set_exception(exc)
        return

    def follow() -> None:  # on the loop: the arrivals are its futures
        for arrival, future in zip(arrivals, futures, strict=True):
            arrival.add_done_callback(functools.partial(_settle, future))

    if runtime.on_loop():
        follow()
    else:
        runtime.call_soon(follow)


def _settle(future: Future[Any], arrival: asyncio.Future[Any]) -> None:
    if arrival.cancelled():
        future.set_exception(asyncio.CancelledError())
    elif (exc := arrival.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(arrival.result())


class CallGather(Gather):
    """The gather of a call: a proc lost under it fails the call in upstream's words, once
    its host agent has said how the proc ended (see ``_exits``)."""

    __slots__ = ("method",)

    def __init__(
        self,
        method: str,
        runtime: Runtime,
        count: int,
        procs: Sequence[str],
        *,
        stream: bool = False,
        result: Future[Any] | None = None,
        want: str = "",
        mesh: ActorMesh[Any] | None = None,
        shared: SharedWatch | None = None,
    ) -> None:
        self.method = method  # before the watchers, which may fire at once
        Gather.__init__(
            self,
            runtime,
            count,
            procs,
            stream=stream,
            result=result,
            want=want,
            mesh=mesh,
            shared=shared,
        )

    def _on_peer_lost(self, address: str, exc: BaseException) -> None:
        then = functools.partial(self._proc_ended, address, exc)
        mesh = self.mesh
        if connection_lost(exc) and isinstance(mesh, ActorMesh):
            when_proc_ended(mesh._state, address, then)
        else:
            then(None)

    def _proc_ended(self, address: str, exc: BaseException, how: str | None) -> None:
        if self._outcome is not None:  # over meanwhile
            return
        mesh = self.mesh
        assert isinstance(mesh, ActorMesh)
        ranks = list(mesh._shape.ndslice)
        state = mesh._state
        if how is None and state.informant in state.runtime.failed_peers:
            error = state.controller_lost_error(self.method, mesh._mesh_id)
        else:
            error = state.proc_lost_error(ranks, self.method, address, how or str(exc))
        if self.arrivals is not None:
            for slot in self.arrivals:
                if not slot.done():
                    slot.set_exception(error)
        self._finish(error)


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
                got = await future
                with hosting():  # user code on the loop (``_placement``)
                    value = self._combine(value, got)
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


def proc_addresses(mesh: ActorMesh[Any]) -> frozenset[str] | None:
    """The procs that the actors of ``mesh`` (a slice: its ranks only) live on, once known
    (None while its procs are starting)."""
    addresses = mesh._state.addresses
    if addresses is None:
        return None
    return frozenset(addresses[rank] for rank in mesh._shape.ndslice if rank < len(addresses))


def mesh_stopped(mesh: ActorMesh[Any]) -> str | None:
    """The status ``mesh`` stopped with (what later calls are told), None while its actors
    run. A function, not an attribute: an attribute of the mesh would hide an endpoint of
    the same name."""
    return mesh._state.stopped


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
        for ep_name, prop in endpoints_of(cls).items():  # names checked by spawn_actor_mesh
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
        trace = outgoing(self._name, method, self._mesh_id, self._shape)
        procs = self._cast_here()
        if procs is not None:
            self._post_to(procs, method, payload, reply, explicit, False, trace)
        else:
            settle_fills()  # handed to the loop: as it is at the call
            self._runtime.call_soon(self._post_cast, method, payload, reply, explicit, trace)

    def _post_cast(
        self,
        method: str,
        payload: Sequence[Buffer],
        reply: PortRef | None,
        explicit: bool,
        trace: str,
    ) -> None:
        """Post one Call per proc of the (sliced) mesh, in order with earlier casts."""

        def go(ready: list[str] | BaseException) -> None:
            if isinstance(ready, BaseException):
                log.warning("dropped %s() cast: %s", method, ready)
                return
            self._post_to(ready, method, payload, reply, explicit, False, trace)

        self._state.when_ready(go)

    def _post_to(
        self,
        procs: list[str],
        method: str,
        payload: Sequence[Buffer],
        reply: PortRef | None,
        explicit: bool = False,
        gather: bool = False,
        trace: str = "",
        tree: bool = False,
    ) -> None:
        """One message per process hosting part of the (sliced) mesh, down the cast tree;
        with ``tree`` (a gathered call, not streamed) the replies come back up it."""
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
            trace,
            tree and gather and not explicit,
        )
        runtime.cast(targets, self._mesh_id, call, payload)

    def _cast_plan(self, procs: list[str]) -> tuple[list[int], ShapeSpec, list[str]]:
        """The ranks this (sliced) mesh covers, its shape on the wire, and the processes
        hosting them in rank order (computed once: a cast costs O(processes))."""
        plan = self._plan
        if plan is None or plan[0] is not procs:
            ranks = list(self._shape.ndslice)
            targets = list(dict.fromkeys(procs[rank] for rank in ranks))
            plan = self._plan = (procs, ranks, shape_spec(self._shape), targets)
        return plan[1], plan[2], plan[3]

    def _start_cast(
        self,
        method: str,
        payload: Sequence[Buffer],
        want: str,
        explicit: bool,
        trace: str,
        result: Future[Any],
    ) -> None:
        """Post the cast now (or after earlier casts, once the procs are up); loop only.

        ``result`` is completed straight from the gathering port: no future in between.
        """

        def go(ready: list[str] | BaseException) -> None:
            if isinstance(ready, SupervisionError) and ready.endpoint is None:
                ready = SupervisionError(str(ready), endpoint(self._name, method))
            if isinstance(ready, BaseException):
                result.set_exception(ready)
            else:
                self._cast_gathering(ready, method, payload, want, explicit, result, trace)

        self._state.when_ready(go)

    def _cast_gathering(
        self,
        procs: list[str],
        method: str,
        payload: Sequence[Buffer],
        want: str,
        explicit: bool,
        result: Future[Any],
        trace: str = "",
    ) -> None:
        ranks, _, targets = self._cast_plan(procs)
        runtime = self._runtime
        if want == "stream":
            gather = CallGather(method, runtime, len(ranks), targets, stream=True, mesh=self)
            self._post_to(procs, method, payload, gather.port, explicit, True, trace)
            result.set_result(gather.arrivals)
            return
        count = len(ranks)
        shared = self._state.watched(procs)
        gather = CallGather(
            method, runtime, count, targets, result=result, want=want, mesh=self, shared=shared
        )
        self._post_to(procs, method, payload, gather.port, explicit, True, trace, tree=True)

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
        """Completes (with ``None``) once the actors exist: after their ``__init__`` ran,
        whether it raised or not, as upstream's, which leaves a failed ``__init__`` to
        supervision and to the calls that follow (``SupervisionError``). Raises only when
        the mesh could not be spawned at all (its procs never started)."""
        state = self._state

        async def wait() -> None:
            started: asyncio.Future[None] = self._runtime.loop.create_future()
            state.when_ready(
                lambda ready: (
                    started.set_exception(ready)
                    if isinstance(ready, BaseException) and state.stopped is None
                    else started.set_result(None)
                )
            )
            await started
            if state.spawn_gather is not None:
                # its failures (a raising __init__, a dead proc) are supervision's to report
                with contextlib.suppress(Exception):
                    await state.spawn_gather.done

        return run_on(self._runtime, wait())

    def stop(self, reason: str = "stopped by client") -> Future[tuple[()]]:
        """Drain and stop every actor of the mesh (``__cleanup__`` runs); later calls fail
        (told, as upstream's, that the ActorMeshController received an explicit stop).
        Resolves to ``()``, as upstream's does."""
        return submit_into(self._runtime, self._start_stop, ACTOR_MESH_STOPPED)

    def _start_stop(self, reason: str, result: Future[tuple[()]]) -> None:
        """Stop the actors; later calls are told ``reason`` (the status they stopped with).

        As upstream's, the stop returns at ``cleanup_timeout`` at the latest: an actor
        whose code never gets to the stop (an ``__init__`` that never returns, an endpoint
        still running) does not hold its caller; its proc's stop ends it."""

        def finish(values: list[Any] | None, error: BaseException | None) -> None:
            if state.watch is not None:  # no call waits on its procs any more
                state.watch.close()
            if result.done():
                return  # given up on at cleanup_timeout
            # An actor whose proc is gone has stopped too: only other errors fail the stop.
            if error is not None and not isinstance(error, SupervisionError):
                result.set_exception(error)
            else:
                result.set_result(())

        def give_up() -> None:
            if not result.done():
                result.set_result(())

        def go(ready: list[str] | BaseException) -> None:
            if isinstance(ready, BaseException):
                result.set_result(())  # never started: nothing to stop
                return
            ranks, _, targets = self._cast_plan(ready)
            gather = Gather(self._runtime, len(ranks), targets, on_done=finish)
            self._post_to(ready, STOP_METHOD, dumps(reason), gather.port, gather=True, tree=True)
            self._runtime.loop.call_later(current_config().cleanup_timeout, give_up)

        state = self._state
        state.when_ready(go)
        state.stopped = reason
        state.stopped_event = status_event(state.actor_name(self._shape.ndslice[0]), reason)

    def __reduce__(self) -> Any:
        state = self._state
        addresses = state.addresses or state.known_addresses()
        spec = shape_spec(self._shape)
        base = shape_spec(state.base)
        args = (
            self._class,
            self._mesh_id,
            self._name,
            addresses,
            spec,
            base,
            state.owner,
            state.informant,
        )
        return (_rebuild_actor_mesh, args)

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name} of {self._class.__name__} {self._shape.extent!r}>"


def _rebuild_actor_mesh(
    cls: type,
    mesh_id: str,
    name: str,
    procs: list[str] | ProcsRef,
    spec: ShapeSpec,
    base: ShapeSpec | None = None,
    owner: str = ROOT,
    informant: str = "",
) -> ActorMesh[Any]:
    shape = shape_of(spec)
    base_shape = shape_of(base) if base is not None else shape
    runtime = current_runtime()
    known = None if isinstance(procs, ProcsRef) else procs
    state = _MeshState(
        runtime,
        known,
        procs,
        cls=cls,
        name=name,
        base=base_shape,
        owner=owner,
        informant=informant,
    )
    if known is None:  # its procs were starting: casts wait for their addresses
        runtime.call_soon(state.wait_for, procs, None)
    return ActorMesh(cls, mesh_id, name, shape, state)
