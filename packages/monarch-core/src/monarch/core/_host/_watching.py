"""A host agent watches its procs for their spawner: supervision fans in through the hosts.

A spawner on another host would otherwise watch each proc itself: a connection each way
with heartbeats on both, two beats a second per proc at a job's controller (issue 34).
Instead the procs' host agent, which the spawner watches anyway, watches them by heartbeat
on their host, and the spawner and its procs leave each other unbeaten
(``Runtime.vouched``); the controller beats its host agents only. What the spawner hears:

- a proc that exits: ``ProcExited`` from its agent, as always (its parent waits on it), and
  its connections closing;
- a proc silent past the deadline (frozen): ``ProcLost`` from its agent, with the agent's
  own words ("ADDRESS sent no heartbeat for ..."); the spawner writes it off and fences it
  as when it saw that silence itself (``KillProcs``);
- the agent lost (killed, partitioned, frozen): the spawner writes off the agent's procs
  (``_ProcGroup.host_lost``); the procs, which watch their agent, stop; a worker agent
  kills its procs when it loses their spawner (``_spawn_procs_for_owner``).

Nor does the spawner need a connection to each such proc, or they to it: a proc tells its
agent it is ready and the agent tells the spawner (``ProcReady``), and the spawner sends a
spawn or a stop for the procs of a host to their agent, which passes it on (``Relay``,
``_mesh._relay``) and gathers the actors' answers into one message up. What is left between
a spawner and its procs is what it casts (to the heads of its cast tree) and its calls to
one actor: a job's controller holds O(hosts + fan-out) connections, not O(procs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from monarch.core._mesh._mesh_state import connection_lost
from monarch.core._runtime import Runtime
from monarch.core._runtime._combine import Combine
from monarch.core._runtime._messages import (
    TO_PROC,
    PortRef,
    ProcLost,
    ProcReady,
    Relay,
    SpawnActor,
)
from monarch.core._runtime._peers import agent_watches
from monarch.transport import Buffer

from ._zygote import Child


@dataclass(frozen=True, slots=True)
class Running:
    """A proc this agent started, until it exits, and the spawner's ports it tells of it:
    ``events`` (its exit, its loss) and ``ready``."""

    child: Child
    events: PortRef
    ready: PortRef


_running: dict[int, Running] = {}
"""The procs this agent started that have not exited, by pid: an agent that outlives many
jobs keeps only its running procs (a list of every proc it ever started grew by one per
proc, forever: issue 34)."""
_early: dict[int, ProcReady] = {}
"""Procs that said they are ready before the agent learned it started them (a fork by the
zygote answered after the new proc's first message), by pid."""


def started(runtime: Runtime, child: Child, events: PortRef, ready: PortRef) -> None:
    """The agent started ``child`` for the spawner whose events go to ``events`` (and whose
    procs report ready to ``ready``)."""
    _running[child.pid] = Running(child, events, ready)
    early = _early.pop(child.pid, None)
    if early is not None:
        _watch_for_spawner(runtime, early)


def proc_exited(child: Child) -> None:
    """The agent's proc ``child`` exited: nothing of it is kept (not the record of a later
    proc given its reused pid)."""
    running = _running.get(child.pid)
    if running is not None and running.child is child:
        del _running[child.pid]
    _early.pop(child.pid, None)


def running_child(pid: int) -> Child | None:
    """The running proc ``pid`` that this agent started, if it is one."""
    running = _running.get(pid)
    return running.child if running is not None else None


def running_children() -> list[Child]:
    """The procs this agent started that are still running (``ProcSnapshot.children``
    counts them)."""
    return [running.child for running in list(_running.values())]  # watchers remove some


def vouch_for(runtime: Runtime, parent: str, spawner: str, ready: ProcReady) -> bool:
    """In a new proc: have its host agent (``parent``) watch it for its ``spawner``, when
    that is how the two watch it (``agent_watches``; the spawner decides alike). Returns
    whether the agent does: it then tells the spawner that the proc is ready."""
    if agent_watches(spawner, parent):
        runtime.vouched[spawner] = parent
        runtime.post(parent, TO_PROC, "", ready)
        return True
    return False


def handle_proc_ready(
    runtime: Runtime, body: ProcReady, payload: Sequence[Buffer], sender: str
) -> None:
    """A proc of ours asks to be watched for its spawner (``vouch_for``): tell the spawner
    it is ready, and watch it by heartbeat; if it goes silent while it runs, tell the
    spawner (which fences it)."""
    if sender != body.address:
        return  # not the proc itself speaking
    if body.pid not in _running:
        _early[body.pid] = body  # told once the agent knows it started it (``started``)
        return
    _watch_for_spawner(runtime, body)


def _watch_for_spawner(runtime: Runtime, body: ProcReady) -> None:
    events = _running[body.pid].events
    runtime.send_to_port(_running[body.pid].ready, body)

    def lost(address: str, exc: BaseException) -> None:
        if connection_lost(exc):
            return  # it ended: its exit is reported as every exit is (ProcExited)
        runtime.send_to_port(events, ProcLost(body.rank, body.pid, str(exc)))

    runtime.watch_peer(body.address, lost)


def handle_relay(runtime: Runtime, body: Relay, payload: Sequence[Buffer], sender: str) -> None:
    """A spawner's message for procs of this host (``_mesh._relay``): passed on to each, over
    the connections the agent has with its procs. A spawn's ``__init__`` outcomes come back
    here (``SpawnActor.ack``) and go up as one ``PortBatch``, at once on an error or on a
    proc's loss, as the spawner's own gather would end (``Combine``)."""
    message = body.body
    if not isinstance(message, SpawnActor):
        for proc in body.procs:
            runtime.post(proc, TO_PROC, "", message)
        return
    if len(body.ranks) != len(body.procs) or not all(body.ranks):
        return  # malformed: nothing to pass on (the spawner's gather watches the procs)
    count = sum(len(ranks) for ranks in body.ranks)
    combine = Combine(runtime, message.reply, count, fail_fast=True, watch=body.procs)
    for proc, ranks in zip(body.procs, body.ranks, strict=True):
        runtime.post(proc, TO_PROC, "", message.for_ranks(ranks, combine.port), payload)
