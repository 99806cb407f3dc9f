"""``job.remote_mount`` and ``job.gather_mount``: a client directory on every worker, and
the workers' directories on the client, as copies kept in step by checksum.

Upstream mounts them with FUSE. Here they are copies made with the core's code-sync
machinery (``push_directories``, ``gather_directories``: only files whose SHA-256 differs
travel, each renamed into place whole), applied by ``state()`` and brought up to date by
``job.refresh_mounts()``. Why not FUSE (see the package README): a FUSE mount needs
``/dev/fuse`` and the right to mount on every worker (often absent in containers and
pods), turns each ``stat``/``open`` of a Python start-up on every worker into a round trip
to the client (the client serves N hosts' imports), and hangs readers when the client goes
away; a copy is read at local-disk speed, survives the client, and costs only what changed.
What it gives up: a gathered directory shows the workers' files as of the last refresh,
not live.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from monarch.core import Extent, HostMesh, Point, gather_directories, push_directories

SUBDIR: Final = "$SUBDIR"
"""Upstream's token in a gathered path: each host's coordinate key (``hosts_0``)."""
TIMEOUT: Final = 600.0
"""Seconds a mount's push or gather may take before ``state()`` gives up on it."""


@dataclass(frozen=True)
class RemoteMount:
    source: str
    mntpoint: str | None
    meshes: list[str] | None
    python_exe: str | None


@dataclass(frozen=True)
class GatherMount:
    remote_mount_point: str
    local_mount_point: str
    meshes: list[str] | None


@dataclass
class Mounts:
    """A job's declared mounts (each client declares its own, as upstream's)."""

    remote: list[RemoteMount] = field(default_factory=list)
    gather: list[GatherMount] = field(default_factory=list)

    def apply(self, hosts: Mapping[str, HostMesh]) -> dict[str, HostMesh]:
        """Push every remote mount, then gather; the meshes, those with a mounted
        ``python_exe`` starting their procs with it."""
        meshes = self.push(hosts)
        self.refresh_gathered(hosts)
        return meshes

    def push(self, hosts: Mapping[str, HostMesh]) -> dict[str, HostMesh]:
        """Bring every remote mount up to date on its hosts; the meshes, as ``apply``."""
        meshes = dict(hosts)
        for mount in self.remote:
            target = mount.mntpoint or mount.source
            names = _chosen(hosts, mount.meshes)
            agents = [a for name in names for a in hosts[name].host_agents()]
            push_directories(agents, {Path(mount.source).resolve(): target}).get(TIMEOUT)
            if mount.python_exe and (Path(mount.source) / mount.python_exe).exists():
                python = str(Path(target) / mount.python_exe)
                for name in names:
                    meshes[name] = meshes[name].with_python_executable(python)
        return meshes

    def refresh_gathered(self, hosts: Mapping[str, HostMesh]) -> list[str]:
        """Bring every gathered directory up to date; the local files that changed."""
        pulls: list[tuple[str, str, Path]] = []
        for mount in self.gather:
            names = _chosen(hosts, mount.meshes)
            for name in names:
                mesh = hosts[name]
                for rank, agent in enumerate(mesh.host_agents()):
                    key = host_key(Point(rank, mesh.extent))
                    local = Path(mount.local_mount_point)
                    local = local / key if len(names) == 1 else local / name / key
                    remote = mount.remote_mount_point.replace(SUBDIR, key)
                    pulls.append((agent, remote, local))
        if not pulls:
            return []
        return gather_directories(pulls).get(TIMEOUT)


def host_key(point: Point) -> str:
    """Upstream's coordinate key of a host: ``hosts_0``, ``hosts_1_gpus_0``..."""
    extent: Extent = point.extent
    return "_".join(f"{label}_{point[label]}" for label in extent.labels) or "host"


def _chosen(hosts: Mapping[str, HostMesh], meshes: list[str] | None) -> list[str]:
    if meshes is None:
        return sorted(hosts)
    unknown = sorted(set(meshes) - set(hosts))
    if unknown:
        raise ValueError(f"no mesh {unknown} in this job (its meshes: {sorted(hosts)})")
    return list(meshes)
