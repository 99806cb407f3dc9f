"""Starting the procs of a host mesh: one spawn's group of procs and its logger mesh, the
bootstrap that runs in each new proc, and the procs this process has spawned."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from monarch._zygote_start import preloaded
from monarch.core._config import KEYS, current_config, runtime_env
from monarch.core._errors import MeshFailure, PeerLost, RemoteFailure, SupervisionError
from monarch.core._layout._shape import Point, Shape
from monarch.core._payload._serialize import dumps, loads
from monarch.core._placement import unpin_this_thread
from monarch.core._runtime import Runtime
from monarch.core._runtime._instrument import supervision
from monarch.core._runtime._messages import (
    TO_PROC,
    Body,
    KillProcs,
    Launch,
    LogLines,
    PortValue,
    ProcExited,
    ProcLost,
    ProcReady,
    RunBootstrap,
    SpawnFailed,
    SpawnProcs,
    StopProc,
)
from monarch.core._runtime._peers import agent_watches
from monarch.core._runtime._scope import Owner
from monarch.transport import Buffer

from ._actor_mesh import ActorMesh
from ._client_end import ending
from ._exits import ended, expect, unknown
from ._future import Outcome
from ._gather import Gather
from ._logs import LogSink
from ._mesh_state import connection_lost
from ._reports import failed_event, failed_report, mesh_uid, process_ended
from ._supervision import call_fault_hook, log_failure
from ._workspace import SYNCED_ENV, synced

log = logging.getLogger("monarch.actor")


class _ProcGroup:
    """The processes of one ``spawn_procs`` call: their addresses and their exits."""

    def __init__(self, runtime: Runtime, count: int) -> None:
        self.runtime = runtime
        self.count = count
        self.addresses: list[str | None] = [None] * count
        self.pids: list[int] = [0] * count
        self.hosts: list[str] = [""] * count
        """Each rank's host agent: the parent that can kill it."""
        self.ready: asyncio.Future[None] = runtime.loop.create_future()
        self._ready_count = 0
        """Ranks with an address (counted: a check of all per proc is O(procs²))."""
        self.exited: dict[int, str] = {}
        self.stopping = False
        self.mesh_id = ""
        """The proc mesh's id (``NAME<uid>``), as telemetry's tables know it."""
        self.actor_meshes: list[ActorMesh[Any]] = []
        """Actor meshes spawned here on these procs: a deliberate stop is no failure."""
        self._exit_seen = asyncio.Event()
        self._watches: list[tuple[str, int]] = []
        """What ``watch`` asked the runtime for: ``(address, key)``."""
        self.events = runtime.open_port(self.on_event)
        self.logger: _LoggerMesh | None = None
        """Who hears of a proc that died (see ``_LoggerMesh``); set once the shape is known."""
        self.logs: LogSink | None = None
        """The procs' output, when forwarded (``enable_log_forwarding`` at spawn)."""

    def on_ready(self, body: Body, payload: Sequence[Buffer]) -> None:
        if isinstance(body, ProcReady) and 0 <= body.rank < self.count:
            if self.addresses[body.rank] is None:
                self._ready_count += 1
            self.addresses[body.rank] = body.address
            self.pids[body.rank] = body.pid
            expect(body.address)  # its host agent will say how it ends
            host = self.hosts[body.rank]
            if host and agent_watches(self.runtime.address, host):
                self.runtime.vouched[body.address] = host  # and whether it goes silent
            if self._ready_count == self.count and not self.ready.done():
                self.ready.set_result(None)

    def on_event(self, body: Body, payload: Sequence[Buffer]) -> None:
        if isinstance(body, LogLines):
            if self.logs is not None:
                self.logs.receive(body)
        elif isinstance(body, SpawnFailed):
            self._fail(RuntimeError(f"proc {body.rank}: {body.reason}"))
        elif isinstance(body, ProcLost):
            address = self.addresses[body.rank] if 0 <= body.rank < self.count else None
            if address is not None and body.rank not in self.exited:
                self.runtime.peer_lost(address, PeerLost(body.reason))  # fenced: proc_lost
        elif isinstance(body, ProcExited):
            self.exited[body.rank] = body.how
            address = self.addresses[body.rank] if 0 <= body.rank < self.count else None
            if address is None:
                said = "".join(f"\n    {line}" for line in body.tail)
                said = f"; the last lines of its stderr:{said}" if said else ""
                self._fail(
                    RuntimeError(
                        f"proc {body.rank} (pid {body.pid}) {body.how} before it was ready{said}"
                    )
                )
            else:
                ended(address, body.how)
                self.runtime.vouched.pop(address, None)
                self.runtime.peer_exited(address, f"(pid {body.pid}) {body.how}")
                if self.logger is not None and not self.stopping:
                    self.logger.proc_died(body.rank, body.how, self.hosts_root_actors(address))
            self._changed()
            if len(self.exited) == self.count:
                self.runtime.close_port(self.events)
                for peer, key in self._watches:
                    self.runtime.unwatch_peer(peer, key)
                self._watches.clear()
                if self.logs is not None:
                    self.logs.flush()

    def hosts_root_actors(self, address: str) -> bool:
        """Whether a live actor mesh of the client's own is on the proc at ``address``:
        its failure reports that proc's death to the user, by the name they gave it."""
        for mesh in self.actor_meshes:
            state = mesh._state
            supervised = state.supervised
            if supervised is None or supervised.owner is not None or state.stopped is not None:
                continue
            addresses, procs = state.addresses, state.procs
            if addresses is None:  # spawned, not yet resolved
                if not isinstance(procs, Outcome):
                    addresses = list(procs or ())
                elif procs.done() and procs._error is None:
                    addresses = procs._wait()
            if address in (addresses or ()):
                return True
        return False

    def started(self) -> dict[int, str]:
        """The procs that reported an address, by rank."""
        return {rank: a for rank, a in enumerate(self.addresses) if a is not None}

    async def wait_exited(self, ranks: set[int]) -> None:
        """Until every one of ``ranks`` has exited, or has a host agent that is lost (then
        nobody can tell us of its exit: see ``unreachable``)."""
        hosts = {host for host in self.hosts if host}
        failed = self.runtime.failed_peers
        while True:
            # The count first: each exit wakes this, and the whole check is O(procs).
            if len(self.exited) >= len(ranks) and ranks <= self.exited.keys():
                return
            if any(host in failed for host in hosts) and ranks <= (
                self.exited.keys() | self.unreachable()
            ):
                return
            await self._exit_seen.wait()

    def unreachable(self) -> set[int]:
        """Ranks with no exit reported whose host agent is declared lost: none can stop
        them from here, nor say when they end."""
        failed = self.runtime.failed_peers
        return {
            rank
            for rank, host in enumerate(self.hosts)
            if host and host in failed and rank not in self.exited
        }

    def _changed(self, *_: object) -> None:
        self._exit_seen.set()
        self._exit_seen = asyncio.Event()

    @contextmanager
    def watching_hosts(self) -> Iterator[None]:
        """While open, a host agent declared lost wakes ``wait_exited`` (it may make
        ranks unreachable)."""
        hosts = {host for host in self.hosts if host and host != self.runtime.address}
        watches = [(host, self.runtime.watch_peer(host, self._changed)) for host in hosts]
        try:
            yield
        finally:
            for host, key in watches:
                self.runtime.unwatch_peer(host, key)

    def host_lost(self, address: str, exc: BaseException) -> None:
        """A host agent is lost: nobody will say how its procs end (a dead one's died with
        it), so what waits for that word (``_exits``) waits no longer. The procs it watched
        for us (``Runtime.vouched``) are lost with it, for the agent's reason: ours to them
        carry no heartbeats (they stop themselves once they lose their agent)."""
        if not self.ready.done():
            self._fail(SupervisionError(f"host agent {address} failed while starting procs: {exc}"))
        runtime = self.runtime
        for rank, host in enumerate(self.hosts):
            proc = self.addresses[rank]
            if host == address and proc is not None and rank not in self.exited:
                unknown(proc)
                if runtime.vouched.get(proc) == address and not self.stopping:
                    runtime.peer_lost(proc, exc)

    def proc_lost(self, address: str, exc: BaseException) -> None:
        """Fencing: a proc declared failed without having exited (silent past the
        heartbeat: frozen, cut off) may come back; the job has written it off, so its host
        agent kills it now, while it cannot act (SIGKILL ends a stopped process too)."""
        if self.stopping or connection_lost(exc):
            return
        ranks = [r for r, a in enumerate(self.addresses) if a == address and r not in self.exited]
        by_host: dict[str, list[int]] = {}
        for rank in ranks:
            host = self.hosts[rank]
            if host and host != self.runtime.address and host not in self.runtime.failed_peers:
                by_host.setdefault(host, []).append(self.pids[rank])
        for host, pids in by_host.items():
            log.warning("fencing procs %s at %s: %s", pids, address, exc)
            self.runtime.post(host, TO_PROC, "", KillProcs(tuple(pids), f"written off: {exc}"))

    def watch(self) -> None:
        """Once started: hear of lost host agents and of procs declared failed (above),
        until every proc has exited. Remote procs only: one on this host is seen to exit
        by its parent, here."""
        runtime = self.runtime
        watches = self._watches
        for host in {h for h in self.hosts if h and h != runtime.address}:
            watches.append((host, runtime.watch_peer(host, self.host_lost)))
        for rank, proc in enumerate(self.addresses):
            if proc is not None and self.hosts[rank] != runtime.address:
                watches.append((proc, runtime.watch_peer(proc, self.proc_lost)))

    def _fail(self, exc: BaseException) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)


class _LoggerMesh:
    """Upstream's per-proc log-forwarding actors, as their failures show: each proc mesh
    has one, ``logger-<uid>``, owned by the mesh's spawner, so a proc that dies (outside a
    stop) is a failure of that mesh for the spawner's ``__supervise__`` (at the root, the
    fault hook), whether or not any actor of the spawner's lived there."""

    def __init__(
        self, runtime: Runtime, owner: Owner | None, shape: Shape, per_host: int, together: int
    ) -> None:
        self.runtime = runtime
        self.owner = owner
        self.shape = shape
        self.per_host = per_host
        self.together = together
        """Procs per OS process (``procs_per_process``): a group rank covers up to that many."""
        self.name = "logger-" + mesh_uid()

    def proc_died(self, process: int, how: str, reported_elsewhere: bool = False) -> None:
        """The OS process ``process`` (a rank of the group) ended as ``how`` says;
        ``reported_elsewhere``: a root-owned actor mesh there reports it (``call_fault_hook``)."""
        reason, clean = process_ended(how)
        if clean:  # a clean exit is a stop, as for actors
            return
        per, together = self.per_host, self.together
        processes = -(-per // together)  # OS processes per host, as spawn_procs starts them
        host, local = divmod(process, processes)
        first = host * per + local * together
        ranks = list(range(first, min(first + together, (host + 1) * per)))
        if not ranks:
            return
        actor = f"{self.name}{Point(ranks[0], self.shape.extent)!r}"
        event, report = failed_event(actor, reason), failed_report(actor, reason)
        failure = MeshFailure(self.name, ranks, event, None, report)
        supervision(self.name, len(ranks))
        log_failure(failure)
        if self.owner is not None:
            self.owner.supervise(failure)
            return
        try:
            self.runtime.loop.run_in_executor(None, call_fault_hook, failure, reported_elsewhere)
        except RuntimeError:  # the interpreter is exiting: nobody to tell but the log
            # Unless the user's mesh there reported it, or another failure is ending the
            # client (its procs die with it, their exits arriving as Python ends).
            quiet = reported_elsewhere or ending()
            log.log(logging.INFO if quiet else logging.WARNING, "at exit: %s", failure.report())


def preload_list() -> str:
    """The modules procs of this spawn should find imported (``proc_preload``)."""
    return preloaded(current_config().proc_preload, sys.modules)


async def _start_procs(
    runtime: Runtime,
    hosts: list[str],
    per_host: int,
    name: str,
    bootstrap: Callable[[], object] | None,
    group: _ProcGroup,
    python: str = "",
    launches: Sequence[Sequence[Launch]] = (),
) -> list[str]:
    ready_port = runtime.open_port(group.on_ready)
    watches = [(host, runtime.watch_peer(host, group.host_lost)) for host in hosts]
    # The procs get this process's configuration and the job's root, wherever they run.
    env = runtime_env()
    env[KEYS["proc_preload"].env[0]] = preload_list()
    if synced:
        env[SYNCED_ENV] = os.pathsep.join(sorted(synced))
    root = runtime.root or runtime.address
    try:
        for i, host in enumerate(hosts):
            group.hosts[i * per_host : (i + 1) * per_host] = [host] * per_host
            launch = tuple(launches[i]) if launches else ()
            spawn = SpawnProcs(
                per_host,
                i * per_host,
                ready_port,
                group.events,
                name,
                env,
                python,
                root,
                launch,
                forward_output=group.logs is not None,
            )
            runtime.post(host, TO_PROC, "", spawn)
        await asyncio.wait_for(group.ready, current_config().host_spawn_ready_timeout)
    except BaseException as exc:
        for address in group.started().values():  # a failed start leaves no procs behind
            runtime.post(address, TO_PROC, "", StopProc("the proc mesh failed to start"))
        if isinstance(exc, TimeoutError):
            raise TimeoutError(
                f"procs of {name!r} did not start within host_spawn_ready_timeout"
            ) from None
        raise
    finally:
        runtime.close_port(ready_port)
        for host, key in watches:
            runtime.unwatch_peer(host, key)
    addresses = [a for a in group.addresses if a is not None]
    group.watch()
    if bootstrap is not None:
        try:
            await _run_bootstrap(runtime, addresses, bootstrap)
        except BaseException:
            for address in addresses:  # a mesh that failed to start leaves no procs behind
                runtime.post(address, TO_PROC, "", StopProc("bootstrap failed"))
            raise
    return addresses


async def _run_bootstrap(
    runtime: Runtime, addresses: list[str], bootstrap: Callable[[], object]
) -> None:
    gather = Gather(runtime, len(addresses), set(addresses))
    payload = dumps(bootstrap)
    for address in addresses:
        runtime.post(address, TO_PROC, "", RunBootstrap(gather.port), payload)
    await gather.done


def handle_run_bootstrap(
    runtime: Runtime, body: RunBootstrap, payload: Sequence[Buffer], sender: str
) -> None:
    """Run the bootstrap function on a thread of its own, so that it may block on futures
    (spawn an actor here and call it, as upstream's may) while the loop serves them, and
    so that unpickling it (its module's imports) does not hold up the loop. No actor of
    the mesh is spawned before it is done: the spawner waits for its reply."""
    threading.Thread(
        target=_run_bootstrap_here, args=(runtime, body, payload), name="bootstrap", daemon=True
    ).start()


def _run_bootstrap_here(runtime: Runtime, body: RunBootstrap, payload: Sequence[Buffer]) -> None:
    unpin_this_thread()  # started where the loop may be pinned (``_placement``)
    try:
        loads(payload)()
    except Exception as exc:  # noqa: BLE001 - reported to whoever spawned the procs
        _report_bootstrap(runtime, body, exc)
    else:
        runtime.send_to_port(body.reply, PortValue(0), dumps(None))


def _report_bootstrap(runtime: Runtime, body: RunBootstrap, exc: Exception) -> None:
    failure = RemoteFailure(exc, repr(exc), f"bootstrap failed on {runtime.address}")
    runtime.send_to_port(body.reply, PortValue(0, True), dumps(failure))


@dataclass(frozen=True)
class SpawnedProc:
    """A process this one spawned (``spawned_procs``)."""

    mesh: str
    """The name ``spawn_procs`` was given (``procs`` by default)."""
    rank: int
    """Its rank among the processes of that call (a process per rank, unless
    ``procs_per_process`` puts several ranks in one)."""
    host: str
    """Its host agent's address (this process for ``this_host()``)."""
    address: str | None
    """Where it listens (``None`` while it starts)."""
    pid: int
    exited: str | None
    """How it ended ("exited with code 0", "was killed by signal 9"), or ``None``."""


_spawned: list[tuple[str, _ProcGroup]] = []
"""Every ``spawn_procs`` of this process, by name, for ``spawned_procs``."""


KEEP_ENDED = 32
"""Groups whose procs have all ended that ``spawned_procs`` still lists (the newest)."""


def _remember(name: str, group: _ProcGroup) -> None:
    _spawned.append((name, group))
    ended_groups = [entry for entry in _spawned if len(entry[1].exited) == entry[1].count]
    for entry in ended_groups[:-KEEP_ENDED]:
        _spawned.remove(entry)


def spawned_procs() -> list[SpawnedProc]:
    """The processes this one spawned (from any thread), those that ended included: what
    an admin server of the client walks (``monarch.admin``)."""
    return [
        SpawnedProc(
            name,
            rank,
            group.hosts[rank],
            group.addresses[rank],
            group.pids[rank],
            group.exited.get(rank),
        )
        for name, group in list(_spawned)
        for rank in range(group.count)
    ]
