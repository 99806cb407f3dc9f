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
"""

from __future__ import annotations

from collections.abc import Sequence

from monarch.core._mesh._mesh_state import connection_lost
from monarch.core._runtime import Runtime
from monarch.core._runtime._messages import TO_PROC, PortRef, ProcLost, ProcReady
from monarch.core._runtime._peers import agent_watches
from monarch.transport import Buffer

from ._zygote import Child

_spawners: dict[int, PortRef] = {}
"""The spawner's ``events`` port of each running proc this agent started, by pid."""


def started(child: Child, events: PortRef) -> None:
    """The agent started ``child`` for the spawner whose events go to ``events``."""
    _spawners[child.pid] = events


def proc_exited(pid: int) -> None:
    """The agent's proc ``pid`` exited: its spawner is no longer ours to tell of it (a proc
    no agent watched, its spawner local, would otherwise stay here for the agent's life)."""
    _spawners.pop(pid, None)


def vouch_for(runtime: Runtime, parent: str, spawner: str, ready: ProcReady) -> None:
    """In a new proc: have its host agent (``parent``) watch it for its ``spawner``, when
    that is how the two watch it (``agent_watches``; the spawner decides alike)."""
    if agent_watches(spawner, parent):
        runtime.vouched[spawner] = parent
        runtime.post(parent, TO_PROC, "", ready)


def handle_proc_ready(
    runtime: Runtime, body: ProcReady, payload: Sequence[Buffer], sender: str
) -> None:
    """A proc of ours asks to be watched for its spawner (``vouch_for``): watch it by
    heartbeat; if it goes silent while it runs, tell the spawner (which fences it)."""
    events = _spawners.get(body.pid)
    if events is None or sender != body.address:
        return  # not a proc this agent started, or not the proc itself speaking

    def lost(address: str, exc: BaseException) -> None:
        _spawners.pop(body.pid, None)
        if connection_lost(exc):
            return  # it ended: its exit is reported as every exit is (ProcExited)
        runtime.send_to_port(events, ProcLost(body.rank, body.pid, str(exc)))

    runtime.watch_peer(body.address, lost)
