"""Spawning an actor mesh, and supervising it from its spawner: a failed actor or a dead
proc becomes a ``MeshFailure`` for the mesh's owner."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from monarch.core._errors import MeshFailure
from monarch.core._layout._shape import Shape
from monarch.core._payload._serialize import dumps_spawn
from monarch.core._runtime import Runtime
from monarch.core._runtime._instrument import instrumented, spawned, supervision
from monarch.core._runtime._messages import TO_PROC, ActorFailed, Relay, SpawnActor, shape_spec
from monarch.core._runtime._scope import Owner, current_owner
from monarch.transport import Buffer

from ._actor_mesh import ActorMesh
from ._endpoint import Actor, actor_is_async, check_endpoints_callable, endpoints_of
from ._future import run_on
from ._gather import Gather
from ._mesh_state import (
    Procs,
    _MeshState,
    connection_lost,
    failure_mesh_name,
    resolve,
    when_proc_ended,
)
from ._mocks import current_mocks, mocked_class
from ._relay import by_agent
from ._reports import ROOT, failed_event, failed_report, mesh_uid, process_ended
from ._supervision import call_fault_hook, log_failure

log = logging.getLogger("monarch.actor")


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
        log_failure(failure)
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
        spawned(mesh_id, name, cls, shape, procs_id, owner_name)

    async def post() -> Gather:
        addresses = await resolve(procs)
        hosted: dict[str, list[int]] = {}  # one spawn message per process, for its ranks
        for rank in shape.ndslice:
            hosted.setdefault(addresses[rank], []).append(rank)
        gather = Gather(runtime, len(shape.ndslice), hosted)
        spec = shape_spec(shape)
        spawn = SpawnActor(mesh_id, name, 0, spec, gather.port, (), owner_name)
        direct, relayed = by_agent(runtime, hosted)
        for address in direct:
            runtime.post(address, TO_PROC, "", spawn.for_ranks(hosted[address]), payload)
        for agent, theirs in relayed.items():  # one message per host (see ``_relay``)
            each = tuple(tuple(hosted[proc]) for proc in theirs)
            runtime.post(agent, TO_PROC, "", Relay(tuple(theirs), spawn, each), payload)
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
