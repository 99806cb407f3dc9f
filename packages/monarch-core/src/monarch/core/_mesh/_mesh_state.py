"""What the spawner of an actor mesh knows of it: its procs, once they have started, and
how it learns that one of them ended."""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from monarch.core._errors import SupervisionError
from monarch.core._layout._shape import Point, Shape
from monarch.core._runtime import Runtime
from monarch.core._runtime._messages import Body, HowEnded, ProcExited
from monarch.core._runtime._scope import Owner
from monarch.transport import Buffer

from ._ask import ask_body
from ._exits import ASKED_GRACE, asking, ended, unknown, when_ended
from ._future import Outcome, wait_outcome
from ._gather import Gather, SharedWatch
from ._pending import ProcsRef
from ._reports import ROOT, actor_name, endpoint, failed_report, process_ended, status_event


class Supervisor(Protocol):
    """What a mesh's state asks of its supervision in the process that spawned it (the
    mesh's owner, and watching its procs once their addresses are known); ``_spawn_actors``
    implements it, above this module."""

    owner: Owner | None
    """The actor whose code spawned the mesh, or ``None`` for the client (the root)."""

    def watch(self, addresses: list[str]) -> None:
        """Hear at once when a proc under the mesh dies."""


def connection_lost(exc: BaseException) -> bool:
    """Whether a peer was declared failed because its connection closed: then the host
    agent's word on how it ended is worth waiting for (a heartbeat's silence, or any
    other cause, says more than the exit that follows our cutting it off)."""
    return str(exc).startswith("lost connection to ")


_watch_lock = threading.Lock()
"""Makes each mesh's ``SharedWatch`` once, whichever threads call it first."""


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
        self.supervised: Supervisor | None = None
        """Set in the process that spawned the mesh: who owns it, and what failed."""
        self.watch: SharedWatch | None = None
        """Its procs, watched for its gathered calls (made at the first, see ``watched``)."""

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

    def watched(self, addresses: list[str]) -> SharedWatch:
        """The watch its gathered calls share (from any thread: a caller may cast itself).
        Made at the first: a mesh that is only passed around connects to none of its procs."""
        watch = self.watch
        if watch is None:
            with _watch_lock:
                watch = self.watch
                if watch is None:
                    watch = self.watch = SharedWatch(self.runtime, addresses)
        return watch

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

    def controller_lost_error(self, method: str, mesh_id: str) -> SupervisionError:
        """What a call is told when a proc of this mesh was lost and so was the process
        that spawned it, which alone could say how the proc ended (an owner that died
        ungracefully, taking its procs with it): upstream's words for a mesh whose
        controller cannot be reached (ours: the owner is the controller)."""
        reason = (
            f"timed out reaching controller {self.owner} for mesh "
            f"{failure_mesh_name(mesh_id)}. Assuming controller's proc is dead"
        )
        return SupervisionError(failed_report(self.owner, reason), endpoint(self.name, method))

    def when_ready(self, then: Callable[[list[str] | BaseException], None]) -> None:
        if self.stopped is not None:
            then(SupervisionError(self.stopped_event))
        elif self.addresses is not None:
            then(self.addresses)
        elif self.error is not None:
            then(self.error)
        else:
            self.backlog.append(then)


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


Procs = Sequence[str] | Outcome[list[str]]
"""Proc addresses by rank, or the future of them while the procs start."""


async def resolve(procs: Procs) -> list[str]:
    if isinstance(procs, Outcome):
        pending: Outcome[Any] = procs
        return list(await wait_outcome(pending))
    return list(procs)
