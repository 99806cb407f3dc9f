"""``exec_command``: run a shell command on every host (or proc) of a mesh.

Upstream's way to run a plain program on a job's hosts (``monarch exec``): one proc per
host (or ``per_host`` procs) runs the command as a child process whose environment says
where it runs: ``MONARCH_RANK_<DIM>`` and ``MONARCH_SIZE_<DIM>`` for every dimension of
the proc mesh (``MONARCH_RANK_HOSTS=1``, ``MONARCH_SIZE_HOSTS=2``). The job secret is
never passed to the command (it would let any program it runs join the job).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from monarch.actor import Actor, current_rank, endpoint
from monarch.core import (
    SECRET_ENV,
    Extent,
    Future,
    HostMesh,
    Point,
    ValueMesh,
    current_runtime,
    run_on,
)


class Ran(NamedTuple):
    """What one rank's command did: where (its point), its exit status, and its output
    (stdout then stderr) when asked to keep it."""

    point: dict[str, int]
    returncode: int
    output: bytes | None


class _Runner(Actor):
    """Runs the command in its proc, as a child process, with its rank in the environment."""

    @endpoint
    def run(
        self,
        argv: list[str],
        env: dict[str, str],
        workdir: str | None,
        output_dir: str | None,
        capture: bool,
        only: dict[str, int] | None,
    ) -> Ran | None:
        point = current_rank()
        if only is not None and any(point[dim] != value for dim, value in only.items()):
            return None  # not where it is to run (the ranks keep the whole mesh's coordinates)
        child_env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        child_env.update(env)
        child_env.update(rank_env(point))
        name = "-".join(f"{dim}{point[dim]}" for dim in point) or "rank0"
        stdout: Any = None
        if output_dir is not None:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            stdout = open(Path(output_dir) / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        elif capture:
            stdout = subprocess.PIPE
        try:
            done = subprocess.run(
                argv,
                env=child_env,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT if stdout is not None else None,
                check=False,
            )
        except OSError as exc:  # no such program, or workdir: the shell's status for it
            message = f"monarch exec: cannot run {argv[0]!r}: {exc.strerror}\n".encode()
            return Ran(dict(point), 127, message if capture else None)
        finally:
            if output_dir is not None:
                stdout.close()
        output = done.stdout if capture and output_dir is None else None
        return Ran(dict(point), done.returncode, output)


def rank_env(point: Point) -> dict[str, str]:
    """``MONARCH_RANK_<DIM>``/``MONARCH_SIZE_<DIM>`` of every dimension of ``point``."""
    env = {}
    for dim in point:
        env[f"MONARCH_RANK_{dim.upper()}"] = str(point[dim])
        env[f"MONARCH_SIZE_{dim.upper()}"] = str(point.size(dim))
    return env


def exec_command(
    host_mesh: HostMesh,
    cmd: str | Sequence[str],
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    output_dir: str | None = None,
    rank: int | None = None,
    point: Mapping[str, int] | None = None,
    per_host: Mapping[str, int] | None = None,
) -> Future[int]:
    """Run ``cmd`` (a shell command line, or an argv) on every host of ``host_mesh``;
    ``per_host`` procs each (``{"gpus": 8}``), else one. ``rank`` (a flat rank) or
    ``point`` (``{"hosts": 1}``) runs it at one place only. ``env`` is added to the
    environment, ``workdir`` is its working directory there, ``output_dir`` (a folder on
    each host) gets one ``<point>.log`` per rank with its output, which otherwise goes
    where the proc's does. The Future's value: 0 when every rank's command exited 0, else
    the first non-zero status in rank order."""
    outcome = run_commands(host_mesh, cmd, env, workdir, output_dir, rank, point, per_host)
    return outcome.then(_status)


def _status(results: list[Ran]) -> int:
    return next((r.returncode for r in results if r.returncode != 0), 0)


def run_commands(
    host_mesh: HostMesh,
    cmd: str | Sequence[str],
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    output_dir: str | None = None,
    rank: int | None = None,
    point: Mapping[str, int] | None = None,
    per_host: Mapping[str, int] | None = None,
    capture: bool = False,
) -> Future[list[Ran]]:
    """``exec_command``'s work, every rank's ``Ran`` in rank order (``capture``: with its
    output, for ``monarch exec``)."""
    argv = _argv(cmd)
    extra = _checked_env(env)
    runners = Runners(host_mesh, per_host)
    try:
        where = runners.where(rank, point)
    except ValueError:
        runners.stop()  # no procs left behind by bad input
        raise
    ran = runners.run(argv, extra, workdir, output_dir, where, capture)

    async def run_then_stop() -> list[Ran]:
        try:
            return await ran
        finally:
            await runners.stop()

    return run_on(current_runtime(), run_then_stop())


class Runners:
    """Procs on a host mesh (``per_host`` each) that run commands, for one command
    (``exec_command``) or many (``monarch shell``)."""

    def __init__(self, host_mesh: HostMesh, per_host: Mapping[str, int] | None = None) -> None:
        self._procs = host_mesh.spawn_procs(per_host=dict(per_host or {}), name="exec")
        self._runners = self._procs.spawn("exec", _Runner)
        self.extent = self._procs.extent

    def where(
        self, rank: int | None = None, point: Mapping[str, int] | None = None
    ) -> dict[str, int] | None:
        """The one place ``rank`` or ``point`` names (None: everywhere), checked."""
        if rank is not None and point is not None:
            raise ValueError("give rank= or point=, not both")
        if rank is None and point is None:
            return None
        return _point_of(self.extent, rank, point)

    def run(
        self,
        argv: list[str],
        env: dict[str, str],
        workdir: str | None,
        output_dir: str | None,
        where: dict[str, int] | None,
        capture: bool,
    ) -> Future[list[Ran]]:
        call: Future[ValueMesh[Ran | None]] = self._runners.run.call(
            argv, env, workdir, output_dir, capture, where
        )
        labels = self.extent.labels

        def in_rank_order(results: ValueMesh[Ran | None]) -> list[Ran]:
            ran = [r for r in results.values() if r is not None]
            return sorted(ran, key=lambda r: [r.point[dim] for dim in labels])  # row-major

        return call.then(in_rank_order)

    def stop(self) -> Future[None]:
        return self._procs.stop("commands done")


def _checked_env(env: Mapping[str, str] | None) -> dict[str, str]:
    extra = {str(k): str(v) for k, v in (env or {}).items()}
    if SECRET_ENV in extra:
        raise ValueError(f"env must not hold {SECRET_ENV}: commands never get the job secret")
    return extra


def _argv(cmd: str | Sequence[str]) -> list[str]:
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("exec_command: the command is empty")
        return ["/bin/sh", "-c", cmd]
    argv = list(cmd)
    if not argv or not all(isinstance(arg, str) for arg in argv):
        raise ValueError(f"exec_command: cmd must be a string or a non-empty argv, not {cmd!r}")
    return argv


def _point_of(extent: Extent, rank: int | None, point: Mapping[str, int] | None) -> dict[str, int]:
    """The coordinates of ``rank`` (flat) or ``point`` in ``extent``, checked."""
    size = extent.nelements
    if rank is not None:
        if type(rank) is not int or not 0 <= rank < size:
            raise ValueError(f"rank {rank!r} is not in 0..{size - 1} (extent {extent!r})")
        return dict(Point(rank, extent))
    assert point is not None
    labels = extent.labels
    unknown = [dim for dim in point if dim not in labels]
    if unknown:
        raise ValueError(f"point {dict(point)!r}: no dimension {unknown[0]!r} in {extent!r}")
    for dim, value in point.items():
        if type(value) is not int or not 0 <= value < extent[dim]:
            raise ValueError(f"point {dict(point)!r}: {dim}={value!r} is outside {extent!r}")
    return dict(point)
