"""``sync_workspace``: the user's directories pushed to every host, and reloaded in procs.

Each host gets one proc (``code_sync``, spawned once per host agent and kept) with a
``WorkspaceHost`` actor that answers its manifest (files and SHA-256, see ``_workspace``)
and writes what it is sent, each file under a temporary name renamed into place. The
client compares manifests and sends each host only the files that differ (read once,
sent to every host that needs them, a batch at a time), then removes those deleted
locally: one changed file costs that file, whatever the workspace's size. A host that
fails mid-sync is named in a ``WorkspaceSyncError``; the others are synced.

The procs of the meshes synced get a ``Reloader`` actor that puts the synced directories
on their ``sys.path``; with ``auto_reload=True`` it reloads the modules whose files
changed, and updates their classes and functions in place (``_reload``): the next call
to an actor that already exists runs the new code.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from monarch.core._errors import MeshFailure, WorkspaceSyncError
from monarch.core._layout._shape import NDSlice, Shape
from monarch.core._mesh._actor_mesh import ActorMesh
from monarch.core._mesh._endpoint import Actor, endpoint
from monarch.core._mesh._future import Future, run_on, wait_outcome
from monarch.core._mesh._proc_mesh import HostMesh, ProcMesh, install_workspace_sync, this_proc
from monarch.core._mesh._workspace import (
    Hashes,
    Manifest,
    Workspace,
    batches,
    changes,
    remove,
    remove_temporaries,
    synced,
    workspace_root,
    write_whole,
)
from monarch.core._runtime import current_runtime

from ._reload import Reloader

log = logging.getLogger("monarch.actor")

BATCH_BYTES: Final = 32 << 20
"""Bytes of files per message to a host (and read ahead of the hosts' replies)."""

_ONE: Final = Shape([], NDSlice(0, [], []))


class WorkspaceHost(Actor):
    """A host's side of ``sync_workspace``: its files, by checksum, and writing them."""

    def __init__(self) -> None:
        self._hashes = Hashes()

    @endpoint
    def manifest(self, dst: str) -> Manifest:
        """The files under ``$WORKSPACE_DIR/dst`` (what a cut sync left half-written
        removed first)."""
        root = workspace_root() / dst
        remove_temporaries(root)
        return self._hashes.manifest(root)

    @endpoint
    def write(self, dst: str, files: list[tuple[str, bytes, int]]) -> None:
        root = workspace_root() / dst
        for relative, data, mode in files:
            self._hashes.remember(write_whole(root, relative, data, mode), data)

    @endpoint
    def remove(self, dst: str, relatives: list[str]) -> None:
        remove(workspace_root() / dst, relatives)

    @endpoint
    def read(self, dst: str, relatives: list[str]) -> list[tuple[str, bytes, int]]:
        """These files (for ``gather_directories``); one gone meanwhile is left out."""
        return _read(workspace_root() / dst, relatives)


class WorkspaceReloader(Actor):
    """A proc's side: the synced directories on ``sys.path``; reloading what changed."""

    def __init__(self) -> None:
        self._reloader = Reloader()

    @endpoint
    def watch(self, dsts: list[str]) -> None:
        for dst in dsts:
            self._reloader.watch(workspace_root() / dst)

    @endpoint
    def reload(self, changed_files: dict[str, list[str]]) -> list[str]:
        """Reload the modules loaded from these files (by directory synced)."""
        paths = [
            workspace_root() / dst / rel for dst, rels in changed_files.items() for rel in rels
        ]
        changed = self._reloader.reload_files(paths)
        if changed:
            print(f"reloaded modules: {changed}", flush=True)  # as upstream's
        return changed


class CodeSyncHosts(Actor):
    """The job's ``WorkspaceHost`` of each host agent, in a proc of its own there; one
    actor in each process that syncs (spawned there on first use), owner of those procs.

    It handles their failures: a host that dies fails the sync that was using it (which
    names it), not the client (the root's fault hook would end it).
    """

    def __init__(self) -> None:
        self._hosts: dict[str, ActorMesh[WorkspaceHost]] = {}

    @endpoint
    def host(self, address: str) -> ActorMesh[WorkspaceHost]:
        actor = self._hosts.get(address)
        if actor is None:
            procs = HostMesh([address], _ONE, current_runtime()).spawn_procs(name="code_sync")
            actor = self._hosts[address] = procs.spawn("workspace_host", WorkspaceHost)
        return actor

    @endpoint
    def forget(self, addresses: list[str]) -> None:
        """These hosts failed: the next sync starts a new proc there."""
        for address in addresses:
            self._hosts.pop(address, None)

    def __supervise__(self, failure: MeshFailure) -> bool:
        log.info("sync_workspace: %s", failure.report())
        return True


_lock = threading.Lock()
_reloaders: dict[int, tuple[ProcMesh, ActorMesh[WorkspaceReloader], set[str]]] = {}
"""id(proc mesh) -> (the mesh, its reloaders, the directories they watch)."""
_hashes = Hashes()
"""The client's checksums, kept across syncs (files that did not change are not read)."""

_keeper: list[ActorMesh[CodeSyncHosts]] = []
"""This process's ``CodeSyncHosts`` (spawned on first use)."""


def _hosts_keeper() -> ActorMesh[CodeSyncHosts]:
    with _lock:
        if not _keeper:
            _keeper.append(this_proc().spawn("code_sync_hosts", CodeSyncHosts))
        return _keeper[0]


def _reloader(mesh: ProcMesh) -> tuple[ActorMesh[WorkspaceReloader], set[str]]:
    with _lock:
        known = _reloaders.get(id(mesh))
        if known is None:
            actors = mesh.spawn("workspace_reloader", WorkspaceReloader)
            known = _reloaders[id(mesh)] = (mesh, actors, set())
        return known[1], known[2]


def sync_workspace(
    hosts: Sequence[str],
    meshes: Sequence[ProcMesh],
    workspace: Workspace,
    conda: bool = False,
    auto_reload: bool = False,
) -> Future[None]:
    """Push ``workspace`` to the host agents ``hosts``; then put it on the ``sys.path``
    of the procs of ``meshes`` (and with ``auto_reload``, reload what changed there)."""
    if not isinstance(workspace, Workspace):
        raise TypeError(f"workspace must be a Workspace, not {type(workspace).__name__}")
    if conda:
        raise NotImplementedError(
            "sync_workspace(conda=True): syncing a conda environment is not supported; "
            "install the environment on the hosts and sync the code directories"
        )
    for src in workspace.dirs:
        if not src.is_dir():
            raise FileNotFoundError(f"workspace directory {str(src)!r} does not exist")
    unique = list(dict.fromkeys(hosts))
    controller = _hosts_keeper()
    reloaders = [_reloader(mesh) for mesh in meshes if not mesh._stopped]
    synced.update(dst or "." for dst in workspace.dirs.values())  # for procs spawned later
    return run_on(
        current_runtime(), _sync(controller, unique, reloaders, dict(workspace.dirs), auto_reload)
    )


def push_directories(hosts: Sequence[str], dirs: dict[Path, str]) -> Future[None]:
    """Make each ``dst`` (absolute, or under ``$WORKSPACE_DIR``) of every host agent in
    ``hosts`` match the local ``src``, as ``sync_workspace`` does (a job's
    ``remote_mount``); ``WorkspaceSyncError`` names the hosts that failed."""
    for src in dirs:
        if not src.is_dir():
            raise FileNotFoundError(f"directory {str(src)!r} does not exist")
    controller = _hosts_keeper()
    unique = list(dict.fromkeys(hosts))
    return run_on(current_runtime(), _sync(controller, unique, [], dict(dirs), False))


def gather_directories(pulls: Sequence[tuple[str, str, Path]]) -> Future[list[str]]:
    """For each ``(host agent, remote directory, local directory)``: make the local one
    match the host's (only files whose checksums differ travel; each written whole; files
    gone there removed here). The local files that changed, as ``local/relative``;
    ``WorkspaceSyncError`` names the hosts that failed (the others were gathered)."""
    controller = _hosts_keeper()
    return run_on(current_runtime(), _gather(controller, list(pulls)))


async def _gather(
    keeper: ActorMesh[CodeSyncHosts], pulls: list[tuple[str, str, Path]]
) -> list[str]:
    hosts = list(dict.fromkeys(address for address, _, _ in pulls))
    asked = [keeper.host.call_one(address) for address in hosts]
    actors = {a: await wait_outcome(f._cf) for a, f in zip(hosts, asked, strict=True)}
    failures: dict[str, BaseException] = {}
    changed: list[str] = []
    for address, remote_dir, local_dir in pulls:
        if address in failures:
            continue
        try:
            changed += await _pull(actors[address], remote_dir, local_dir)
        except Exception as exc:  # noqa: BLE001 - this host failed; the others go on
            failures[address] = exc
    if failures:
        await wait_outcome(keeper.forget.call_one(list(failures))._cf)
        ranks = {address: rank for rank, address in enumerate(hosts)}
        raise WorkspaceSyncError(
            {ranks[address]: (address, error) for address, error in failures.items()},
            len(hosts),
        )
    return changed


async def _pull(actor: ActorMesh[WorkspaceHost], remote_dir: str, local_dir: Path) -> list[str]:
    remote = await wait_outcome(actor.manifest.call_one(remote_dir)._cf)
    await asyncio.to_thread(remove_temporaries, local_dir)
    local = await asyncio.to_thread(_hashes.manifest, local_dir)
    fetch, gone = changes(remote, local)
    for group in batches(((path, remote[path][0]) for path in fetch), BATCH_BYTES):
        files = await wait_outcome(actor.read.call_one(remote_dir, group)._cf)
        await asyncio.to_thread(_write_all, local_dir, files)
    await asyncio.to_thread(remove, local_dir, gone)
    return [str(local_dir / path) for path in [*fetch, *gone]]


def _write_all(root: Path, files: list[tuple[str, bytes, int]]) -> None:
    for relative, data, mode in files:
        _hashes.remember(write_whole(root, relative, data, mode), data)


async def _sync(
    keeper: ActorMesh[CodeSyncHosts],
    hosts: list[str],
    reloaders: list[tuple[ActorMesh[WorkspaceReloader], set[str]]],
    dirs: dict[Path, str],
    auto_reload: bool,
) -> None:
    asked = [keeper.host.call_one(address) for address in hosts]
    actors = {a: await wait_outcome(f._cf) for a, f in zip(hosts, asked, strict=True)}
    failures: dict[str, BaseException] = {}
    changed: dict[str, list[str]] = {}
    for src, dst in dirs.items():
        live = {a: actor for a, actor in actors.items() if a not in failures}
        changed[dst], failed = await _sync_dir(live, src, dst)
        failures.update(failed)
    if failures:
        await wait_outcome(keeper.forget.call_one(list(failures))._cf)
    dsts = sorted(set(dirs.values()))
    for actors_of_mesh, watched in reloaders:
        if not set(dsts) <= watched:
            await wait_outcome(actors_of_mesh.watch.call(dsts)._cf)
            watched.update(dsts)
        if auto_reload and any(changed.values()):
            await wait_outcome(actors_of_mesh.reload.call(changed)._cf)
    if failures:
        ranks = {address: rank for rank, address in enumerate(actors)}
        raise WorkspaceSyncError(
            {ranks[address]: (address, error) for address, error in failures.items()},
            len(actors),
        )


async def _sync_dir(
    actors: dict[str, ActorMesh[WorkspaceHost]], src: Path, dst: str
) -> tuple[list[str], dict[str, BaseException]]:
    """Make ``$WORKSPACE_DIR/dst`` of every host match ``src``; the files some host was
    sent, and the hosts that failed."""
    failures: dict[str, BaseException] = {}
    local = await asyncio.to_thread(_hashes.manifest, src)
    asked = {address: actor.manifest.call_one(dst) for address, actor in actors.items()}
    plans: dict[str, tuple[set[str], list[str]]] = {}
    for address, manifest in asked.items():
        try:
            remote = await wait_outcome(manifest._cf)
        except Exception as exc:  # noqa: BLE001 - this host failed; the others go on
            failures[address] = exc
            continue
        send, gone = changes(local, remote)
        plans[address] = (set(send), gone)
    needed = sorted({path for send, _ in plans.values() for path in send})
    pending: dict[str, list[Future[None]]] = {address: [] for address in plans}
    for group in batches(((path, local[path][0]) for path in needed), BATCH_BYTES):
        files = await asyncio.to_thread(_read, src, group)
        await _settle(pending, failures)  # one batch in flight per host: bounded memory
        for address, (wanted, _) in plans.items():
            if address in failures:
                continue
            mine = [f for f in files if f[0] in wanted]
            if mine:
                pending[address].append(actors[address].write.call_one(dst, mine))
    await _settle(pending, failures)
    for address, (_, gone) in plans.items():
        if gone and address not in failures:
            pending[address].append(actors[address].remove.call_one(dst, gone))
    await _settle(pending, failures)
    return needed, failures


async def _settle(
    pending: dict[str, list[Future[None]]], failures: dict[str, BaseException]
) -> None:
    for address, futures in pending.items():
        for future in futures:
            try:
                await wait_outcome(future._cf)
            except Exception as exc:  # noqa: BLE001 - this host failed; the others go on
                failures.setdefault(address, exc)
        futures.clear()


def _read(src: Path, relatives: list[str]) -> list[tuple[str, bytes, int]]:
    files = []
    for relative in relatives:
        try:
            with open(src / relative, "rb") as file:
                files.append((relative, file.read(), os.fstat(file.fileno()).st_mode))
        except FileNotFoundError:
            continue  # removed since the manifest: the next sync removes it there too
    return files


def _proc_mesh_hosts(mesh: ProcMesh) -> list[str]:
    """The host agents of a proc mesh's procs (this process's own for ``this_proc()``)."""
    hosts = mesh._hosts
    runtime = mesh._runtime
    return [hosts[rank] if rank < len(hosts) else runtime.address for rank in mesh._shape.ndslice]


def _install() -> None:
    install_workspace_sync(sync_workspace, _proc_mesh_hosts)


_install()
