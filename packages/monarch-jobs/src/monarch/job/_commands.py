"""The job subcommands of the ``monarch`` command: ``apply``, ``exec``, ``shell``, ``kill``.

Each is an entry point of the ``monarch.commands`` group (see monarch-core's README):
``register`` only builds argparse parsers; the handlers import what they need.

- ``monarch apply JOBFILE``: runs the Python file, takes the job it defines (a
  module-level ``job``, or the one it gave ``set_current_job``), starts it unless the same
  job already runs, and saves it where scripts' ``state()`` look (``--job``, by default
  ``.monarch/job_state.pkl``), so that they attach to it.
- ``monarch exec [--mesh NAME] -- CMD ...``: runs CMD on every host of the saved job
  (``exec_command``), prints each rank's output prefixed with its point, and exits with
  the first non-zero status.
- ``monarch shell [--mesh NAME] [--point DIM=N,... | --rank N] [-e K=V] [--workdir DIR]
  [--kill]``: an interactive shell on one host of the saved job (``monarch.job.shell``),
  upstream's options; ``--all`` instead runs stdin's command lines on every host, in procs
  kept for the session (``cd`` moves the next ones), exiting with the last one's status.
- ``monarch kill [NAME]``: ends the saved job (or context NAME's) and removes it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from monarch.core import HostMesh

    from ._exec import Ran
    from ._trait import JobTrait

DEFAULT_JOB = ".monarch/job_state.pkl"  # as _trait.DEFAULT_JOB_PATH, without importing it


def _job_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--job",
        default=DEFAULT_JOB,
        metavar="PATH",
        help=f"where the job is saved (default: {DEFAULT_JOB}, where scripts' state() look)",
    )


def register_apply(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "apply",
        help="start the job a Python file defines and save it for scripts to attach to",
        description=(
            "Run JOBFILE (its __name__ is not '__main__') and start the job it defines: a "
            "module-level `job`, or the one it passes to set_current_job(). A saved job that "
            "is the same and still runs is kept."
        ),
    )
    parser.add_argument("jobfile", metavar="JOBFILE", help="a Python file defining `job`")
    _job_option(parser)
    parser.set_defaults(func=_apply)


def register_exec(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "exec",
        help="run a command on every host of the saved job",
        description=(
            "Run CMD on the hosts of a mesh of the saved job, with MONARCH_RANK_<DIM> and "
            "MONARCH_SIZE_<DIM> set; print each rank's output prefixed with its point; exit "
            "with the first non-zero status in rank order."
        ),
    )
    _job_option(parser)
    parser.add_argument("--mesh", help="the mesh (needed when the job has several)")
    parser.add_argument(
        "--per-host", action="append", default=[], metavar="DIM=N", help="procs per host"
    )
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--workdir", help="the command's working directory on the hosts")
    parser.add_argument("--rank", type=int, help="run it on this (flat) rank only")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    parser.set_defaults(func=_exec)


def register_shell(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "shell",
        help="open an interactive shell on one host of the saved job",
        description=(
            "Open an interactive shell (over a pseudo-terminal) on one host of the saved "
            "job: flat rank 0 of its first mesh unless --mesh/--point/--rank say otherwise; "
            "exit with its status. --all instead reads command lines from stdin and runs "
            "each with /bin/sh on every host (`cd DIR` moves the next ones)."
        ),
    )
    _job_option(parser)
    parser.add_argument("--mesh", metavar="NAME", help="the mesh (default: the first)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--point", metavar="DIM=N,DIM=N", help="the host at this point")
    where.add_argument("--rank", type=int, help="the host at this flat rank (default 0)")
    where.add_argument("--all", action="store_true", help="run stdin's lines on every host")
    parser.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment"
    )
    parser.add_argument("--workdir", help="the working directory on the host")
    parser.add_argument("--kill", action="store_true", help="kill the job after the shell exits")
    parser.set_defaults(func=_shell)


def register_kill(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "kill", help="end the saved job", description="End the saved job's hosts; remove it."
    )
    _job_option(parser)
    parser.add_argument("name", nargs="?", help="the context whose job to end (monarch context)")
    parser.set_defaults(func=_kill)


# -- the handlers ----------------------------------------------------------------------------


class _Failed(Exception):
    """A command that cannot go on; its message is for the user."""


def _fail_clearly(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report a JobError or bad input as one line and exit status 1, not a traceback."""

    def handler(args: argparse.Namespace) -> int:
        from ._trait import JobError

        try:
            return run(args)
        except (_Failed, JobError, ValueError) as exc:
            print(f"monarch {args.command}: {exc}", file=sys.stderr)
            return 1

    return handler


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    """Say what a long step does and, when it ends, how long it took (on stderr)."""
    print(f"{what}...", file=sys.stderr, flush=True)
    start = time.monotonic()
    yield
    print(f"{what}: done in {time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)


def _defined_job(jobfile: str) -> JobTrait:
    import runpy

    from ._trait import JobTrait, _current

    if not Path(jobfile).is_file():
        raise _Failed(f"no such file: {jobfile}")
    before = list(_current)
    namespace = runpy.run_path(jobfile, run_name="__monarch_apply__")
    job = namespace.get("job")
    if not isinstance(job, JobTrait) and _current != before:
        job = _current[0]
    if not isinstance(job, JobTrait):
        raise _Failed(
            f"{jobfile} defines no job: assign one to a module-level `job` "
            "(job = SlurmJob(...)) or pass it to set_current_job()"
        )
    return job


@_fail_clearly
def _apply(args: argparse.Namespace) -> int:
    from ._trait import job_load

    job = _defined_job(args.jobfile)
    name = type(job).__name__
    if os.path.exists(args.job):
        try:
            saved = job_load(args.job)
        except Exception as exc:  # noqa: BLE001 - any unusable saved job is replaced
            print(f"Replacing the unusable saved job at {args.job}: {exc}", file=sys.stderr)
        else:
            if saved.can_run(job) and saved._is_running():
                print(f"{name} at {args.job} is already running")
                return 0
            if saved._is_running():
                raise _Failed(
                    f"another job saved at {args.job} still runs: `monarch kill --job "
                    f"{args.job}` ends it (or give another --job)"
                )
    with _step(f"Starting {name}"):
        job.apply()
    job.dump(args.job)
    print(f"{name} is running; saved at {args.job}")
    return 0


def _saved_running_job(path: str) -> JobTrait:
    from ._trait import job_load

    job = job_load(path)
    if not job._is_running():
        raise _Failed(f"the job saved at {path} no longer runs (`monarch apply` starts it)")
    return job


def _pairs(items: Sequence[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _Failed(f"{what} must be NAME=VALUE, not {item!r}")
        pairs[key] = value
    return pairs


@_fail_clearly
def _exec(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        raise _Failed("no command given: monarch exec -- CMD ...")
    per_host = {k: _count(v, k) for k, v in _pairs(args.per_host, "--per-host").items()}
    env = _pairs(args.env, "--env")
    from ._exec import run_commands

    mesh = _saved_mesh(args.job, args.mesh)
    ran = run_commands(
        mesh, cmd, env, args.workdir, None, args.rank, None, per_host, capture=True
    ).get()
    return _show(ran, prefix=True)


def _saved_mesh(path: str, name: str | None, first: bool = False) -> HostMesh:
    """The mesh ``name`` (or the only one; with ``first``, the first) of the running job
    saved at ``path``."""
    state = _saved_running_job(path)._state()
    meshes = list(state._hosts) if first else sorted(state._hosts)
    if name is None and len(meshes) != 1 and not first:
        raise _Failed(f"the job has meshes {', '.join(meshes)}: say which with --mesh")
    if name is not None and name not in meshes:
        raise _Failed(f"the job has no mesh {name!r} (its meshes: {', '.join(meshes)})")
    mesh: HostMesh = getattr(state, name or meshes[0])
    return mesh


def _show(ran: Sequence[Ran], prefix: bool, out: TextIO | None = None) -> int:
    """Print each rank's output (prefixed with its point) to ``out`` (stdout); the first
    non-zero status."""
    status = 0
    for result in ran:
        where = ",".join(f"{dim}={value}" for dim, value in result.point.items())
        lead = f"[{where}] " if prefix else ""
        for line in (result.output or b"").decode(errors="replace").splitlines():
            print(f"{lead}{line}", file=out or sys.stdout, flush=True)
        if result.returncode != 0:
            print(f"[{where}] exit status {result.returncode}", file=sys.stderr, flush=True)
            status = status or result.returncode
    return status


@_fail_clearly
def _shell(args: argparse.Namespace) -> int:
    if args.all:
        return _lines_on_every_host(_saved_mesh(args.job, args.mesh, first=True))
    from ._shell import shell

    mesh = _saved_mesh(args.job, args.mesh, first=True)
    if args.point is not None:
        host = mesh.slice(**_point(args.point))
    else:
        flat = mesh.flatten("rank")
        rank = args.rank or 0
        if not 0 <= rank < flat.size():
            raise _Failed(f"--rank {rank}: the mesh has {flat.size()} hosts")
        host = flat.slice(rank=rank)
    status = shell(host, env=_pairs(args.env, "--env") or None, workdir=args.workdir)
    if args.kill:
        _kill(argparse.Namespace(job=args.job, command="kill"))
    return status


def _point(text: str) -> dict[str, int]:
    point = _pairs(text.split(","), "--point")
    if not all(value.isdigit() for value in point.values()):
        raise _Failed(f"--point must be DIM=N,DIM=N, not {text!r}")
    return {dim: int(value) for dim, value in point.items()}


def _lines_on_every_host(mesh: HostMesh) -> int:
    from ._exec import Runners

    runners = Runners(mesh)
    try:
        workdir: str | None = None
        status = 0
        while True:
            if sys.stdin.isatty():
                print("monarch all$ ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() in ("exit", "logout"):
                return status
            line = line.strip()
            if not line:
                continue
            if line == "cd" or line.startswith("cd "):
                # Where the hosts' shell lands, as its own cd would (relative, ~, -P).
                target = f"{line} >/dev/null && pwd -P"
                ran = runners.run(["/bin/sh", "-c", target], {}, workdir, None, None, True)
                results = ran.get()
                failed = [r for r in results if r.returncode]
                status = _show(failed, prefix=True, out=sys.stderr)
                if status == 0 and results:
                    workdir = (results[0].output or b"").decode().strip() or workdir
                continue
            ran = runners.run(["/bin/sh", "-c", line], {}, workdir, None, None, True)
            status = _show(ran.get(), prefix=True)
    finally:
        runners.stop().get(timeout=60)


def _count(value: str, dim: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise _Failed(f"--per-host {dim}={value}: the count must be a positive integer")
    return int(value)


@_fail_clearly
def _kill(args: argparse.Namespace) -> int:
    from ._trait import job_load

    path = Path(args.job)
    if getattr(args, "name", None):
        from ._context import STATE, context_dir

        path = context_dir(args.name) / STATE
    job = job_load(str(path))
    with _step(f"Stopping {type(job).__name__}"):
        job.kill()
    os.remove(path.resolve())  # a context's link stays, pointing at no job
    print(f"killed the job saved at {path}")
    return 0
