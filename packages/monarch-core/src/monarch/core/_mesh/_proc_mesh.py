"""Host and proc meshes: where actors live.

A HostMesh is a list of host agents (see ``_host._bootstrap``); ``spawn_procs`` asks each to
start its share of processes, which report straight back to the caller. The caller
keeps an events port open for the mesh's lifetime, on which the agents report exits.
How one spawn's procs are started and watched is in ``_proc_group``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from monarch.core._config import current_config
from monarch.core._errors import SupervisionError
from monarch.core._layout._shape import NDSlice, Point, Region, Shape, ShapedMesh
from monarch.core._layout._table import gpus_per_host, mesh_table
from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._instrument import instrumented, procs_spawned
from monarch.core._runtime._messages import (
    TO_PROC,
    KillProcs,
    Launch,
    Relay,
    SetLogLevel,
    StopProc,
)
from monarch.core._runtime._scope import current_owner

from ._actor_mesh import ActorMesh, tensor_engine_entry
from ._exits import workers_stopping
from ._future import Future, Outcome, run_on, wait_outcome
from ._launch import BootstrapCommand
from ._logs import LogSink
from ._mesh_state import Procs, resolve
from ._pending import ProcsRef
from ._proc_group import _LoggerMesh, _ProcGroup, _remember, _start_procs
from ._relay import by_agent
from ._spawn_actors import new_mesh_id, spawn_actor_mesh
from ._spawn_hooks import Setup, SetupActor, spawned

log = logging.getLogger("monarch.actor")

T = TypeVar("T")


class ProcMesh(ShapedMesh):
    """Processes laid out on a shape; ``spawn`` puts one actor on each.

    The mesh ``spawn_procs`` returned is *owned*: it alone can be stopped. A slice of it,
    or a copy received in a message, is a reference (as upstream's).
    """

    def __init__(
        self,
        procs: Procs,
        shape: Shape,
        runtime: Runtime,
        group: _ProcGroup | None = None,
        *,
        hosts: Sequence[str] = (),
        base: Shape | None = None,
        python: str = "",
        informant: str = "",
    ) -> None:
        self._procs = procs
        self._shape = shape
        self._runtime = runtime
        self._group = group
        self._spawned_into = group
        """The owner's group, slices included: what its ``stop`` stops first (the actors
        spawned on a slice die with the owner's procs, as its own actors do)."""
        self._stopped = False
        self._hosts = list(hosts)
        """Each rank's host agent (by rank of ``base``)."""
        self._base = base or shape
        """The shape ``spawn_procs`` made (slices keep it)."""
        self._python = python
        """The Python its procs run (``with_python_executable``; "" = the default)."""
        self._informant = informant
        """The process that spawned the procs, which hears how they end (``_exits``); ""
        for ``this_proc()``, whose spawner is not known."""

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        mesh = self._copy(shape)
        mesh._group = self._group if shape == self._shape else None  # a slice is not owned
        mesh._spawned_into = self._spawned_into
        return mesh

    def _copy(self, shape: Shape) -> ProcMesh:
        return ProcMesh(
            self._procs,
            shape,
            self._runtime,
            self._group,
            hosts=self._hosts,
            base=self._base,
            python=self._python,
            informant=self._informant,
        )

    @classmethod
    def from_host_mesh(
        cls,
        host_mesh: HostMesh,
        hy_proc_mesh: ProcMesh,
        region: Region,
        setup: Setup | None = None,
        _attach_controller_controller: bool = True,
    ) -> ProcMesh:
        """Upstream's step of ``HostMesh.spawn_procs``: the ProcMesh over ``region`` of the
        procs being spawned on ``host_mesh``, ``setup`` run on each of them before any
        actor spawned on the result, then the spawn callbacks told of it. Our handle of
        such procs is the ProcMesh ``spawn_procs`` returned (upstream's is a native one);
        every mesh here is owned by its spawner (``_attach_controller_controller`` is
        accepted for upstream's callers)."""
        if not isinstance(hy_proc_mesh, ProcMesh):
            raise TypeError(f"from_host_mesh takes the procs as a ProcMesh, not {hy_proc_mesh!r}")
        if region != hy_proc_mesh._shape.region:
            raise ValueError(f"region {region} is not the procs' {hy_proc_mesh._shape.region}")
        known = set(host_mesh._hosts)
        if hy_proc_mesh._hosts and not known.issuperset(hy_proc_mesh._hosts):
            raise ValueError("the procs were not spawned on this host mesh")
        mesh = hy_proc_mesh
        if setup is not None:
            runtime = hy_proc_mesh._runtime

            async def set_up() -> list[str]:
                addresses = await resolve(hy_proc_mesh._procs)
                runner = hy_proc_mesh.spawn("setup", SetupActor)
                await runner.setup.call(setup)
                await runner.stop()
                return list(addresses)

            procs = ProcsRef.spawning(runtime.address)
            procs.follow(run_on(runtime, set_up())._cf)
            mesh = hy_proc_mesh._copy(hy_proc_mesh._shape)
            mesh._procs = procs
            mesh._spawned_into = hy_proc_mesh._spawned_into
        spawned(mesh)
        return mesh

    @property
    def host_mesh(self) -> HostMesh:
        """The host this proc runs on, as a HostMesh of one (a mesh of one proc only)."""
        if len(self._shape.ndslice) != 1:
            raise NotImplementedError(
                "`ProcMesh.host_mesh` is not yet supported for non-singleton proc meshes."
            )
        rank = self._shape.ndslice[0]
        host = self._hosts[rank] if rank < len(self._hosts) else self._runtime.address
        return HostMesh([host], _UNITY, self._runtime, self._python)

    def to_table(self) -> str:
        """The procs as upstream draws them: a grid of ``host.gpu[i]`` (1 to 3 dimensions)."""
        shape = self._shape
        return mesh_table(
            list(shape.labels),
            list(shape.ndslice.sizes),
            list(shape.ndslice),
            gpus_per_host(dict(zip(self._base.labels, self._base.ndslice.sizes, strict=True))),
        )

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> ActorMesh[T]:
        """Spawn ``Class(*args, **kwargs)`` on every proc; returns the ActorMesh at once."""
        if self._stopped:
            raise RuntimeError("`ProcMesh` has already been stopped")
        failed = self._failures()
        if failed:
            raise SupervisionError(
                f"Cannot spawn new actors on mesh with supervision events: {failed[0]}"
            )
        procs_id = self._group.mesh_id if self._group is not None else ""
        mesh = spawn_actor_mesh(
            self._runtime,
            name,
            Class,
            self._procs,
            self._shape,
            args,
            kwargs,
            self._informant,
            procs_id=procs_id,
        )
        if self._spawned_into is not None:
            self._spawned_into.actor_meshes.append(mesh)
        return mesh

    def _failures(self) -> list[str]:
        """What has gone wrong with the procs of this mesh, as far as this process knows."""
        found: list[str] = []
        group = self._group
        if group is not None and not group.stopping:
            found += [f"proc {rank} {how}" for rank, how in sorted(group.exited.items())]
        procs = self._procs
        if isinstance(procs, Outcome):
            procs = procs._wait() if procs.done() and procs._failure() is None else []
        failed_peers = self._runtime.failed_peers
        found += [f"{a}: {failed_peers[a]}" for a in set(procs) if a in failed_peers]
        return found

    @property
    def initialized(self) -> Future[Literal[True]]:
        """``True`` once every proc runs (as upstream's); raises if they failed to start."""

        async def wait() -> Literal[True]:
            await resolve(self._procs)
            return True

        return run_on(self._runtime, wait())

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc of the mesh and wait for their exits. Only the owned mesh can:
        a slice, a received copy or ``this_proc()`` fails with upstream's ValueError."""
        if self._group is None:
            refused: Future[None] = Future._new()
            refused.set_exception(ValueError("ProcMesh is not owned; must be stopped by an owner"))
            return refused
        self._stopped = True
        return run_on(self._runtime, self._stop(reason))

    async def _stop(self, reason: str) -> None:
        group = self._group
        assert group is not None
        group.stopping = True
        if isinstance(self._procs, ProcsRef):
            self._procs.forget()
        # Stopped first (their procs going away is then no failure); later calls are told
        # the actors stopped with ``reason``, as upstream's are.
        await _stop_actor_meshes(group.actor_meshes, reason)
        try:
            await resolve(self._procs)
        except Exception:  # noqa: BLE001 - a mesh that failed to start: stop what did start
            pass
        started = group.started()
        failed = self._runtime.failed_peers
        timeout = current_config().process_exit_timeout
        direct, relayed = by_agent(self._runtime, started.values())
        for address in direct:
            if address not in failed:
                self._runtime.post(address, TO_PROC, "", StopProc(reason))
        for agent, procs in relayed.items():  # one message per host (see ``_relay``)
            live = tuple(proc for proc in procs if proc not in failed)
            self._runtime.post(agent, TO_PROC, "", Relay(live, StopProc(reason)))
        # One declared lost (frozen past the heartbeat, cut off) may still run: its parent
        # kills it at once, and each exit is reported as any exit is.
        lost = [rank for rank, address in started.items() if address in failed]
        self._kill(group, lost, f"lost before stop ({reason})")
        with group.watching_hosts():
            try:
                await asyncio.wait_for(group.wait_exited(set(started)), timeout)
            except TimeoutError:
                # Frozen (SIGSTOP), stuck in native code, or too busy to stop: as above.
                late = sorted(set(started) - group.exited.keys() - group.unreachable())
                why = f"did not exit within process_exit_timeout ({timeout:g} s) of stop"
                self._kill(group, late, f"{why}: {reason}")
                try:
                    await asyncio.wait_for(group.wait_exited(set(late)), timeout)
                except TimeoutError:
                    left = sorted(set(late) - group.exited.keys() - group.unreachable())
                    if left:
                        raise TimeoutError(
                            f"procs {left} (pids {[group.pids[r] for r in left]}) did not exit "
                            f"after stop, nor when their host agents were asked to kill them"
                        ) from None
        unreachable = sorted(group.unreachable() & set(started))
        if unreachable:
            # Nothing here can stop them: their host agent is lost (dead, or frozen past the
            # heartbeat). A host agent that loses its controller kills its procs itself, and
            # a dead one's procs die with it.
            hosts = sorted({group.hosts[rank] for rank in unreachable})
            log.warning(
                "stop of %s: procs %s (pids %s) not confirmed stopped: their host agent(s) %s "
                "are lost (%s); a host agent that loses its controller kills its procs",
                group.mesh_id,
                unreachable,
                [group.pids[rank] for rank in unreachable],
                ", ".join(hosts),
                "; ".join(str(failed[host]) for host in hosts),
            )

    def _kill(self, group: _ProcGroup, ranks: Sequence[int], why: str) -> None:
        """Ask the host agents of ``ranks`` (those still reachable) to kill them."""
        by_host: dict[str, list[int]] = {}
        for rank in ranks:
            host = group.hosts[rank]
            if rank not in group.exited and host not in self._runtime.failed_peers:
                by_host.setdefault(host, []).append(group.pids[rank])
        for host, pids in by_host.items():
            self._runtime.post(host, TO_PROC, "", KillProcs(tuple(pids), why))

    async def logging_option(
        self,
        stream_to_client: bool = False,
        aggregate_window_sec: int | None = None,
        level: int = logging.INFO,
    ) -> None:
        """Where the procs' output goes (upstream's): with ``stream_to_client`` their lines
        are printed here, each with its origin, or every ``aggregate_window_sec`` seconds,
        similar lines of all ranks as one with their count; ``level`` is the level of the
        procs' root Python logger. Streaming needs ``configure(enable_log_forwarding=True)``
        before the procs were spawned (else this warns, as upstream's, and only sets the
        level)."""
        if aggregate_window_sec is not None and not stream_to_client:
            raise RuntimeError("cannot set aggregate window without streaming to client")
        if isinstance(level, bool) or not isinstance(level, int):
            raise TypeError(f"level is a logging level (an int), not {level!r}")
        if aggregate_window_sec is not None and aggregate_window_sec <= 0:
            raise ValueError(f"aggregate_window_sec must be positive, not {aggregate_window_sec}")
        group = self._group
        sink = group.logs if group is not None else None
        if stream_to_client and sink is None:
            warnings.warn(
                "logging_option(stream_to_client=True) has no effect: log forwarding was "
                "disabled when this ProcMesh was spawned, so no output of its procs reaches "
                "this process. Call configure(enable_log_forwarding=True) before creating "
                "the ProcMesh, or set HYPERACTOR_MESH_ENABLE_LOG_FORWARDING=true",
                UserWarning,
                stacklevel=2,
            )

        async def apply() -> None:
            if sink is not None:
                sink.configure(stream_to_client, aggregate_window_sec)
            for address in set(await resolve(self._procs)):
                self._runtime.post(address, TO_PROC, "", SetLogLevel(level))

        await run_on(self._runtime, apply())

    def sync_workspace(
        self, workspace: Any, conda: bool = False, auto_reload: bool = False
    ) -> Future[None]:
        """``HostMesh.sync_workspace`` for the hosts of these procs, reloading in these
        procs only (upstream's raises NotImplementedError)."""
        sync, hosts_of = _syncer()
        return sync(hosts_of(self), [self], workspace, conda, auto_reload)

    def activate(self) -> Any:
        """A context manager in which torch operations run on this mesh (upstream's
        ``with procs.activate(): ...``). The tensor engine is monarch-tensor's, reached
        through the ``monarch.tensor_engine`` entry point so that the core never imports
        torch; without that wheel this raises an ImportError that names it."""
        return tensor_engine_entry("activate")(self)

    def rank_tensor(self, dim: str | Sequence[str]) -> Any:
        """A tensor of this mesh holding each proc's coordinate along ``dim`` (along
        several: their row-major rank), as upstream's; monarch-tensor's, as ``activate``."""
        return tensor_engine_entry("rank_tensor")(self, dim)

    def rank_tensors(self) -> dict[str, Any]:
        """``rank_tensor`` of every dimension, by name."""
        found: dict[str, Any] = tensor_engine_entry("rank_tensors")(self)
        return found

    async def __aenter__(self) -> ProcMesh:
        if self._stopped:
            raise RuntimeError("`ProcMesh` has already been stopped")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __reduce__(self) -> Any:
        procs: list[str] | ProcsRef
        if isinstance(self._procs, ProcsRef):
            procs = self._procs  # itself picklable, pending or not (see _pending)
        elif isinstance(self._procs, Outcome):
            procs = self._procs._wait()
        else:
            procs = list(self._procs)
        args = (procs, self._shape, self._hosts, self._base, self._python, self._informant)
        return (_rebuild_proc_mesh, args)

    def __repr__(self) -> str:
        return f"<ProcMesh {self._shape.extent!r}>"


async def _stop_actor_meshes(meshes: list[ActorMesh[Any]], reason: str) -> None:
    """Stop the actors of ``meshes`` as ``ActorMesh.stop`` does (concurrent endpoints
    cancelled, ``__cleanup__`` run), all at once, for ``stop_actor_timeout`` at most: as
    upstream's, a proc mesh stops its actors before its procs."""
    stops: list[Future[tuple[()]]] = []
    for mesh in meshes:
        if mesh._state.stopped is None:
            stopped: Future[tuple[()]] = Future._new()
            mesh._start_stop(reason, stopped)
            stops.append(stopped)
    if not stops:
        return
    waits = asyncio.gather(*(wait_outcome(stop) for stop in stops), return_exceptions=True)
    try:
        await asyncio.wait_for(waits, current_config().stop_actor_timeout)
    except TimeoutError:
        pass  # the procs stop anyway: what did not finish dies with them


def _rebuild_proc_mesh(
    procs: list[str] | ProcsRef,
    shape: Shape,
    hosts: Sequence[str] = (),
    base: Shape | None = None,
    python: str = "",
    informant: str = "",
) -> ProcMesh:
    """A received ProcMesh can spawn actors; only its owner can stop it. Its procs may
    still be starting: it then learns their addresses from its owner (``_pending``)."""
    runtime = current_runtime()
    return ProcMesh(
        procs, shape, runtime, hosts=hosts, base=base, python=python, informant=informant
    )


_SHUT_DOWN = "HostMesh has already been shut down"
"""Upstream's words for using a host mesh after ``shutdown()``: users match them."""


class HostMesh(ShapedMesh):
    """Host agents laid out on a shape; ``spawn_procs`` starts processes on each.

    The mesh ``attach_to_workers`` returned is *owned*: it alone can be stopped or shut
    down. ``this_host()``, a slice or a received copy is a reference (as upstream's).
    """

    def __init__(
        self,
        hosts: Sequence[str],
        shape: Shape,
        runtime: Runtime,
        python: str = "",
        *,
        owned: bool = False,
        attached: Future[Literal[True]] | None = None,
    ) -> None:
        self._hosts = list(hosts)
        self._shape = shape
        self._runtime = runtime
        self._python = python
        self._owned = owned
        self._attached = attached
        """Until the host agents answered (``attach_to_workers``); None: they run."""
        self._proc_meshes: list[ProcMesh] = []
        """What ``spawn_procs`` made here: ``stop()`` stops them."""
        self._shut_down = False
        """``shutdown()`` completed: the mesh is unusable (as upstream's)."""

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        owned = self._owned and shape == self._shape
        return HostMesh(
            self._hosts, shape, self._runtime, self._python, owned=owned, attached=self._attached
        )

    def with_python_executable(self, path: str) -> HostMesh:
        """The same hosts, starting procs with the Python at ``path`` (on each host); the
        procs' own ``this_host()`` starts theirs with it too."""
        mesh = HostMesh(self._hosts, self._shape, self._runtime, path, owned=self._owned)
        mesh._attached = self._attached
        return mesh

    @property
    def is_fake_in_process(self) -> bool:
        """Always false: every proc is a process of its own (upstream's in-process fake
        hosts are a testing mode)."""
        return False

    @property
    def initialized(self) -> Future[Literal[True]]:
        """``True`` once the host agents answered (at once, but for ``attach_to_workers``'s
        workers still starting), as upstream's."""
        return Future._of(True) if self._attached is None else self._attached

    @property
    def region(self) -> Region:
        """The labelled host ranks this mesh covers (its shape's region, as upstream's)."""
        return self._shape.region

    @property
    def stream_logs(self) -> bool:
        """Always false, as upstream's 0.7.0 (which never sets it): procs' output reaches the
        client through ``ProcMesh.logging_option``, not through the host mesh."""
        return False

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], object] | None = None,
        name: str | None = None,
        proc_bind: list[dict[str, str]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        """Start ``per_host`` processes on every host; returns the ProcMesh at once.

        ``proc_bind``: per proc of a host, its CPU/NUMA binding (``cpus`` or ``physcpubind``:
        a CPU list such as ``"0-3,8"``; ``cpunodebind``, ``membind``: through numactl).
        ``bootstrap_command``: the command that starts each proc, or a function of its
        point (over the host and ``per_host`` dimensions) giving one.
        """
        if self._shut_down:
            raise RuntimeError(_SHUT_DOWN)
        per_host = dict(per_host or {})
        for label, size in per_host.items():
            value: object = size
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"per_host[{label!r}] must be a positive int, not {size!r}")
            if label in self._shape.labels:
                raise ValueError(f"per_host dimension {label!r} is already a host dimension")
        per = math.prod(per_host.values())
        if proc_bind is not None and len(proc_bind) != per:
            raise ValueError(
                f"proc_bind length ({len(proc_bind)}) must equal procs_per_host ({per})"
            )
        hosts = [self._hosts[rank] for rank in self._shape.ndslice]
        labels = [*self._shape.labels, *per_host]
        sizes = [*self._shape.ndslice.sizes, *per_host.values()]
        shape = Shape(labels, NDSlice.new_row_major(sizes))
        runtime = self._runtime
        # Procs may share OS processes (procs_per_process): `together` ranks per process.
        together = min(current_config().procs_per_process, per)
        processes = -(-per // together)
        launches = _launches(shape, len(hosts), per, together, proc_bind, bootstrap_command)
        # Made here, not on the loop: spawn_procs must not block (it may be called on an
        # event loop, an async actor's).
        group = _ProcGroup(runtime, len(hosts) * processes)
        _remember(name or "procs", group)
        owner = current_owner.get()
        group.mesh_id = new_mesh_id(name or "procs")
        if instrumented():
            procs_spawned(group.mesh_id, name or "procs", shape)
        group.logger = _LoggerMesh(runtime, owner, shape, per, together)
        if current_config().enable_log_forwarding:
            group.logs = LogSink(
                name or "procs", group.hosts, runtime.loop.call_later, group.events
            )
        python = self._python
        attached = self._attached

        async def start() -> list[str]:
            if attached is not None:
                await wait_outcome(attached)
            started = await _start_procs(
                runtime, hosts, processes, name or "procs", bootstrap, group, python, launches
            )
            return [
                started[host * processes + local // together]
                for host in range(len(hosts))
                for local in range(per)
            ]

        addresses = ProcsRef.spawning(runtime.address)
        addresses.follow(run_on(runtime, start())._cf)
        by_rank = [hosts[rank // per] for rank in range(len(hosts) * per)]
        mesh = ProcMesh(addresses, shape, runtime, group, hosts=by_rank, python=python)
        mesh._informant = runtime.address  # this process hears how its procs end
        self._proc_meshes.append(mesh)
        if owner is not None:
            owner.owned.append(mesh)  # it dies with the actor that made it
        else:
            _owned.append(mesh)
        return ProcMesh.from_host_mesh(self, mesh, shape.region)

    def stop(self) -> Future[None]:
        """Stop the procs spawned through this mesh; the hosts stay, for new meshes (as
        upstream's). Only the owned mesh can."""
        if not self._owned:
            refusal = "cannot stop `HostMesh` that is a reference instead of owned"
            return _refused(RuntimeError(refusal))
        meshes = [mesh for mesh in self._proc_meshes if not mesh._stopped]
        self._proc_meshes.clear()
        stops = [mesh.stop("host mesh stopped") for mesh in meshes]

        async def wait_all() -> None:
            for stop in stops:
                await wait_outcome(stop._cf)

        return run_on(self._runtime, wait_all())

    def shutdown(self) -> Future[None]:
        """Stop the procs spawned through this mesh, then its host agents (workers exit).
        Only the owned mesh can (as upstream's).

        The client's own machine is not stopped: its agent is the client itself.
        """
        if not self._owned:
            return _refused(
                RuntimeError("cannot shut down `HostMesh` that is a reference instead of owned")
            )
        if self._shut_down:
            return _refused(RuntimeError(_SHUT_DOWN))
        runtime = self._runtime
        hosts = [self._hosts[rank] for rank in self._shape.ndslice]
        remote = sorted({host for host in hosts if host != runtime.address})
        meshes = [mesh for mesh in self._proc_meshes if not mesh._stopped]
        self._proc_meshes.clear()
        for mesh in meshes:
            mesh._stopped = True

        async def stop() -> None:
            # The procs spawned here are stopped first, as ``stop()`` stops them: their
            # end is then no failure (the agents would kill them, and every actor there
            # would report its proc killed, to the client's fault hook at the root).
            await asyncio.gather(
                *(mesh._stop("host mesh shut down") for mesh in meshes), return_exceptions=True
            )
            loop = runtime.loop
            gone: list[asyncio.Future[None]] = [loop.create_future() for _ in remote]
            workers_stopping(remote)  # their going away is then no failure to warn of
            for host, done in zip(remote, gone, strict=True):
                runtime.watch_peer(host, _resolver(done))
                runtime.post(host, TO_PROC, "", StopProc("host mesh shut down"))
            if gone:
                await asyncio.wait_for(asyncio.gather(*gone), current_config().process_exit_timeout)
            self._shut_down = True

        return run_on(runtime, stop())

    async def __aenter__(self) -> HostMesh:
        if self._shut_down:
            raise RuntimeError(_SHUT_DOWN)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def host_agents(self) -> list[str]:
        """The address of each host's agent, in rank order (low-level API: what a sibling
        wheel hands to ``push_directories``/``gather_directories``)."""
        return [self._hosts[rank] for rank in self._shape.ndslice]

    def sync_workspace(
        self, workspace: Any, conda: bool = False, auto_reload: bool = False
    ) -> Future[None]:
        """Push ``workspace`` (a ``Workspace``) to every host: only the files that differ
        (checksums), each renamed into place whole; the procs spawned here (and this
        process's other proc meshes on these hosts) get it on their ``sys.path``, and with
        ``auto_reload`` reload the modules that changed. Upstream's signature (awaitable;
        ``.get()`` too); a failed host raises ``WorkspaceSyncError`` naming it."""
        sync, hosts_of = _syncer()
        hosts = [self._hosts[rank] for rank in self._shape.ndslice]
        mine = set(hosts)
        meshes = [m for m in self._proc_meshes if not m._stopped]
        meshes += [
            m
            for m in _owned
            if not m._stopped and all(m is not n for n in meshes) and mine.intersection(hosts_of(m))
        ]
        return sync(hosts, meshes, workspace, conda, auto_reload)

    def __reduce__(self) -> Any:
        return (_rebuild_host_mesh, (self._hosts, self._shape, self._python))

    def __repr__(self) -> str:
        return f"<HostMesh {self._shape.extent!r}>"


def _resolver(done: asyncio.Future[None]) -> Callable[[str, BaseException], None]:
    def resolve_once(address: str, exc: BaseException) -> None:
        if not done.done():
            done.set_result(None)

    return resolve_once


def _rebuild_host_mesh(hosts: list[str], shape: Shape, python: str = "") -> HostMesh:
    return HostMesh(hosts, shape, current_runtime(), python)


def _refused(error: BaseException) -> Future[None]:
    """A Future that failed at once, as upstream's refusals fail (when observed)."""
    refused: Future[None] = Future._new()
    refused.set_exception(error)
    return refused


def _launches(
    shape: Shape,
    hosts: int,
    per: int,
    together: int,
    proc_bind: list[dict[str, str]] | None,
    command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None,
) -> list[list[Launch]]:
    """How each host starts each of its processes (none given: the default way)."""
    if proc_bind is None and command is None:
        return []
    launches = []
    for host in range(hosts):
        mine = []
        for local in range(0, per, together):  # a process's first rank speaks for it
            point = Point(host * per + local, shape.extent)
            chosen = command(point) if callable(command) else command
            bind = proc_bind[local] if proc_bind is not None else None
            if chosen is None:  # the default way, bound
                mine.append(Launch(bind=dict(bind or {})))
            else:
                mine.append(chosen.launch(bind))
        launches.append(mine)
    return launches


WorkspaceSync = Callable[[Sequence[str], Sequence["ProcMesh"], Any, bool, bool], Future[None]]
_workspace_sync: list[tuple[WorkspaceSync, Callable[[ProcMesh], list[str]]]] = []
"""``_code_sync``'s ``sync_workspace`` and its hosts of a proc mesh (it stands above)."""


def install_workspace_sync(sync: WorkspaceSync, hosts_of: Callable[[ProcMesh], list[str]]) -> None:
    _workspace_sync[:] = [(sync, hosts_of)]


def _syncer() -> tuple[WorkspaceSync, Callable[[ProcMesh], list[str]]]:
    if not _workspace_sync:
        raise RuntimeError("sync_workspace needs monarch.core imported (import monarch.actor)")
    return _workspace_sync[0]


_owned: list[ProcMesh] = []
"""Proc meshes this process spawned, for shutdown_context."""


_UNITY = Shape([], NDSlice(0, [], []))


def shutdown_context(host_timeout: float | None = None) -> Future[None]:
    """Stop every proc mesh this process spawned; idempotent (also run at exit)."""
    meshes = [mesh for mesh in _owned if not mesh._stopped]
    _owned.clear()
    if not meshes:
        return Future._of(None)
    stops = [mesh.stop("client shutdown") for mesh in meshes]

    async def wait_all() -> None:
        for stop in stops:
            try:
                await asyncio.wait_for(wait_outcome(stop._cf), host_timeout)
            except (TimeoutError, RuntimeError):
                pass

    return run_on(meshes[0]._runtime, wait_all())


host_python = [""]
"""The Python this process's procs run by default (set in a proc started with one, see
``with_python_executable``)."""


def this_host() -> HostMesh:
    """The machine this process runs on, as a mesh of one host (extent ``{}``)."""
    runtime = current_runtime()
    return HostMesh([runtime.address], _UNITY, runtime, host_python[0])


def this_proc() -> ProcMesh:
    """This process, as a mesh of one proc: ``spawn`` on it places actors here."""
    runtime = current_runtime()
    return ProcMesh([runtime.address], _UNITY, runtime)
