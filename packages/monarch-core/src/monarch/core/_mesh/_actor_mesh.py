"""The caller side: actor meshes and the adverbs of their endpoints.

An ``ActorMesh`` is the actors of one spawn; each endpoint is an ``Endpoint`` attribute
with the adverbs (``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``; ``send``
and ``Accumulator`` beside them). A cast pickles its arguments once, posts one message per
process hosting part of the (sliced) mesh down the cast tree (from the caller's own thread
when it may: ``_cast_here``), and gathers replies on a port (``_gather``). The spawner of a
mesh also supervises it: a failed actor or a dead proc becomes a ``MeshFailure`` for the
mesh's owner (``_Supervised``).

To add an adverb: a method of ``Endpoint``, built on ``_submit`` (gathered) or
``ActorMesh._send_cast`` (no replies).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from monarch._wheels import install_hint
from monarch.core._config import current_config
from monarch.core._errors import MeshFailure, SupervisionError
from monarch.core._layout._shape import NDSlice, Point, Shape, ShapedMesh
from monarch.core._layout._value_mesh import ValueMesh
from monarch.core._payload._filling import deferred_fills
from monarch.core._payload._filling import settle as settle_fills
from monarch.core._payload._serialize import dumps, dumps_call_arguments, dumps_spawn, size_of
from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._instrument import instrumented, outgoing, spawned, supervision
from monarch.core._runtime._messages import (
    STOP_METHOD,
    TO_PROC,
    ActorFailed,
    Body,
    Call,
    HowEnded,
    PortRef,
    ProcExited,
    ShapeSpec,
    SpawnActor,
    shape_of,
    shape_spec,
)
from monarch.core._runtime._scope import Owner, current_owner
from monarch.transport import Buffer, plugin_group

from ._ask import ask_body
from ._endpoint import (
    Actor,
    EndpointProperty,
    actor_is_async,
    check_endpoints_callable,
    endpoints_of,
    misnamed_keyword,
)
from ._exits import ASKED_GRACE, asking, ended, unknown, when_ended
from ._future import Future, Outcome, run_on, submit_into, wait_outcome
from ._gather import Gather
from ._mocks import current_mocks, mocked_class
from ._pending import ProcsRef
from ._reports import (
    ACTOR_MESH_STOPPED,
    ROOT,
    actor_name,
    endpoint,
    failed_event,
    failed_report,
    mesh_uid,
    oversize,
    process_ended,
    status_event,
    undeliverable,
)
from ._supervision import call_fault_hook

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


def connection_lost(exc: BaseException) -> bool:
    """Whether a peer was declared failed because its connection closed: then the host
    agent's word on how it ended is worth waiting for (a heartbeat's silence, or any
    other cause, says more than the exit that follows our cutting it off)."""
    return str(exc).startswith("lost connection to ")


class CallGather(Gather):
    """The gather of a call: a proc lost under it fails the call in upstream's words, once
    its host agent has said how the proc ended (see ``_exits``)."""

    __slots__ = ("method",)

    def __init__(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.method = method  # before the watchers, which may fire at once
        super().__init__(*args, **kwargs)

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
        error = mesh._state.proc_lost_error(ranks, self.method, address, how or str(exc))
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


def proc_addresses(mesh: ActorMesh[Any]) -> frozenset[str] | None:
    """The procs that the actors of ``mesh`` (a slice: its ranks only) live on, once known
    (None while its procs are starting)."""
    addresses = mesh._state.addresses
    if addresses is None:
        return None
    return frozenset(addresses[rank] for rank in mesh._shape.ndslice if rank < len(addresses))


class _MeshState:
    """What every slice of one actor mesh shares: addresses once known, casts until then.

    Casts made before the procs are up wait in ``backlog`` and go out in the order
    they were made, after the spawn messages, so FIFO per sender holds from the start.
    Only touched on the runtime loop.
    """

    def __init__(
        self,
        runtime: Runtime,
        addresses: list[str] | None,
        procs: Procs | None = None,
        *,
        cls: type,
        name: str,
        base: Shape,
        owner: str = ROOT,
        informant: str = "",
    ) -> None:
        self.runtime = runtime
        self.procs = procs
        self.addresses = addresses
        """Known at once for a mesh received in a message; after the spawn otherwise."""
        self.cls = cls
        self.name = name
        self.base = base
        """The shape the mesh was spawned on (its slices share this state)."""
        self.owner = owner
        """The name of the actor that spawned it (``<root>``: the client), see ``_reports``."""
        self.informant = informant
        """The process that spawned its procs, which hears how they end ("": unknown)."""
        self.error: BaseException | None = None
        self.stopped: str | None = None
        self.stopped_event = ""
        """Why calls after a stop are refused (upstream's supervision event)."""
        self.backlog: deque[Callable[[list[str] | BaseException], None]] = deque()
        self.spawn_gather: Gather | None = None
        self.supervised: _Supervised | None = None
        """Set in the process that spawned the mesh: who owns it, and what failed."""

    def known_addresses(self) -> list[str] | ProcsRef:
        """The addresses for pickling a mesh that may still be starting: procs still
        starting travel as a reference the receiver resolves (see ``_pending``); a
        receiver's calls that overtake the spawn are held by the target proc until it
        arrives."""
        procs = self.procs
        if procs is None:
            raise TypeError("an ActorMesh with no procs cannot be sent")
        if not isinstance(procs, Outcome):
            return list(procs)
        if isinstance(procs, ProcsRef):
            return procs
        if not procs.done() and self.runtime.on_loop():
            raise TypeError(
                "an ActorMesh whose procs are still starting cannot be sent from the "
                "runtime's loop; await mesh.initialized first"
            )
        return list(procs._wait())

    def wait_for(self, procs: Procs, posted: Outcome[Gather] | None) -> None:
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

    def actor_name(self, rank: int) -> str:
        """Upstream's name of the actor at ``rank`` (of the base shape): its owner's, its
        class, the mesh's name and its point, ``<root>.<module.Class name{'gpus': 0/2}>``."""
        point = Point(self.base.ndslice.index(rank), self.base.extent)
        return actor_name(self.owner, self.cls, self.name, point)

    def proc_lost_error(
        self, ranks: Sequence[int], method: str, address: str, how: str
    ) -> SupervisionError:
        """What a call to ``ranks`` is told when the proc at ``address`` has ended as ``how``
        says: the first of its actors there has failed (or stopped, on a clean exit)."""
        addresses = self.addresses or []
        here = [r for r in ranks if r < len(addresses) and addresses[r] == address]
        actor = self.actor_name((here or list(ranks) or [0])[0])
        reason, clean = process_ended(how)
        text = status_event(actor, reason) if clean else failed_report(actor, reason)
        return SupervisionError(text, endpoint(self.name, method))

    def when_ready(self, then: Callable[[list[str] | BaseException], None]) -> None:
        if self.stopped is not None:
            then(SupervisionError(self.stopped_event))
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
        owner: Owner | None,
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
            if connection_lost(exc):
                when_proc_ended(self.state, address, lambda how: failed(how or str(exc), address))
            else:
                failed(str(exc), address)

        def failed(how: str, address: str) -> None:
            reason, clean = process_ended(how)
            if clean:  # upstream's: the actors stopped, nothing failed
                return
            actor = self.state.actor_name(ranks[0])
            report = failed_report(actor, reason)
            self.fail(ranks, failed_event(actor, reason), report, lost_at=address)

        return lost

    def fail(
        self, ranks: Sequence[int], event: str, report: str | None = None, lost_at: str = ""
    ) -> None:
        """``ranks`` failed; ``lost_at``: the address of their proc, when it ended (they
        could not report it themselves)."""
        if self.state.stopped is not None:
            return
        new = [rank for rank in ranks if rank not in self.failed]
        if not new:
            return
        self.failed.update(new)
        positions = [self.shape.ndslice.index(rank) for rank in new]
        mesh: ActorMesh[Any] = ActorMesh(self.cls, self.mesh_id, self.name, self.shape, self.state)
        failure = MeshFailure(failure_mesh_name(self.mesh_id), positions, event, mesh, report)
        lost = [f"{self.mesh_id}[{rank}]@{lost_at}" for rank in new] if lost_at else []
        supervision(self.name, len(new), lost, report or event)
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
        supervised.fail([body.rank], body.reason, body.report or None)


def when_proc_ended(state: _MeshState, address: str, then: Callable[[str | None], None]) -> None:
    """Call ``then`` with how the proc at ``address`` ended (see ``_exits``); a process
    that did not spawn it asks the one that did, as upstream's supervisors all hear it."""
    runtime = state.runtime
    informant = state.informant
    if informant and informant != runtime.address and asking(address):

        def answer(
            body: Body | None, payload: Sequence[Buffer], error: BaseException | None
        ) -> None:
            if error is not None:  # no answer in time, or the informant is gone
                return
            if isinstance(body, ProcExited) and body.how:
                ended(address, body.how)
            else:
                unknown(address)

        question = functools.partial(HowEnded, address)
        ask_body(runtime, informant, question, ASKED_GRACE, answer)
    when_ended(runtime.loop, address, then)


def handle_how_ended(
    runtime: Runtime, body: HowEnded, payload: Sequence[Buffer], sender: str
) -> None:
    """Tell another process how a proc this one spawned ended ("" if not known)."""
    when_ended(
        runtime.loop,
        body.address,
        lambda how: runtime.send_to_port(body.reply, ProcExited(-1, 0, how or "")),
    )


def failure_mesh_name(mesh_id: str) -> str:
    """``MeshFailure.mesh_name`` of a mesh, as upstream's: its id name, ``-``, its uid."""
    name, _, uid = mesh_id.partition("<")
    return f"{name}-{uid.rstrip('>')}"


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
            trace,
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
        gather = CallGather(method, runtime, count, targets, result=result, want=want, mesh=self)
        self._post_to(procs, method, payload, gather.port, explicit, True, trace)

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
            self._post_to(ready, STOP_METHOD, dumps(reason), gather.port, gather=True)
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
    for name in endpoints_of(cls):
        if name in _RESERVED:
            raise ValueError(
                f"endpoint {name!r} of {cls.__name__} collides with an ActorMesh attribute"
            )


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


Procs = Sequence[str] | Outcome[list[str]]
"""Proc addresses by rank, or the future of them while the procs start."""


async def resolve(procs: Procs) -> list[str]:
    if isinstance(procs, Outcome):
        pending: Outcome[Any] = procs
        return list(await wait_outcome(pending))
    return list(procs)


def new_mesh_id(name: str) -> str:
    """A new mesh's id, ``NAME<uid>`` (an actor mesh's or a proc mesh's)."""
    return f"{id_name(name)}<{mesh_uid()}>"


def id_name(name: str) -> str:
    """A mesh name as upstream writes it in actor ids: lower-case ASCII letters, digits, ``-``
    and ``_``, starting with a letter, at most 63 characters; ``nil`` if nothing is left."""
    kept = "".join(c for c in name.lower() if c in _ID_CHARS)
    kept = kept.lstrip("0123456789-_")[:63].rstrip("-_")
    return kept or "nil"


_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


def spawn_actor_mesh(
    runtime: Runtime,
    name: str,
    cls: object,
    procs: Procs,
    shape: Shape,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    informant: str = "",
    owner_path: str = "",
    procs_id: str = "",
) -> ActorMesh[Any]:
    """Spawn ``cls`` on every proc; returns at once, the actors start in the background.
    ``informant``: the process that spawned the procs (it hears how they end);
    ``owner_path``: the owner's name in supervision texts, if not the spawning actor's;
    ``procs_id``: the proc mesh's id, for telemetry ("" if unknown)."""
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ValueError(f"{cls!r} is not an Actor subclass")
    cls = mocked_class(cls)  # patch_actor's substitute, if any
    check_endpoints_callable(cls)
    actor_is_async(cls)  # raises on mixed endpoints
    _check_endpoint_names(cls)
    payload = dumps_spawn(cls, args, kwargs, current_mocks())
    mesh_id = new_mesh_id(name)
    owner = current_owner.get()
    owner_name = owner_path or (owner.actor_name if owner is not None else ROOT)
    if instrumented():
        spawned(mesh_id, name, cls, shape, procs_id)

    async def post() -> Gather:
        addresses = await resolve(procs)
        hosted: dict[str, list[int]] = {}  # one spawn message per process, for its ranks
        for rank in shape.ndslice:
            hosted.setdefault(addresses[rank], []).append(rank)
        gather = Gather(runtime, len(shape.ndslice), hosted)
        spec = shape_spec(shape)
        for address, ranks in hosted.items():
            several = tuple(ranks) if len(ranks) > 1 else ()
            spawn = SpawnActor(mesh_id, name, ranks[0], spec, gather.port, several, owner_name)
            runtime.post(address, TO_PROC, "", spawn, payload)
        return gather

    state = _MeshState(
        runtime,
        None,
        procs,
        cls=cls,
        name=name,
        base=shape,
        owner=owner_name,
        informant=informant,
    )
    # Supervised before the spawn goes out: an actor's failure may come back at once.
    state.supervised = _Supervised(state, owner, cls, mesh_id, name, shape)
    posted = run_on(runtime, post())._cf
    runtime.call_soon(state.wait_for, procs, posted)
    mesh: ActorMesh[Any] = ActorMesh(cls, mesh_id, name, shape, state)
    if owner is not None:
        owner.owned.append(mesh)
    return mesh
