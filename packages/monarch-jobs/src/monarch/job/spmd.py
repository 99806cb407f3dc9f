"""``serve(["torchrun", ...])``: a torchrun command line as a job whose script runs again
and again on the same hosts (upstream's ``monarch.job.spmd``).

Upstream hands the command to torchx; here the torchrun arguments that shape the job are
read directly (``--nnodes``, ``--nproc-per-node``, ``-m``/``--module``, ``--no-python``
is refused; rendezvous options are not needed: Monarch names the rendezvous) and the
hosts come from one of this package's jobs (``scheduler``). ``run_spmd()`` starts
``nproc-per-node`` procs on every host, gives them torchrun's environment (``monarch.spmd``)
and runs the script in each; the hosts stay for the next run, and ``job_load()`` brings
the job back in another process.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ._process import ProcessJob
from ._slurm import SlurmJob
from ._ssh import SSHJob
from ._state import JobState
from ._store import StoreJob
from ._trait import JobError, JobTrait

SCHEDULERS: Final = ("local", "local_cwd", "slurm", "ssh", "kubernetes")
_KUBE_JOB_ARGS: Final = ("namespace", "timeout", "kubeconfig")
"""``scheduler_cfg`` keys for ``KubernetesJob`` itself; the others are ``add_mesh``'s."""
_IGNORED: Final = (
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-conf",
    "master-addr",
    "master-port",
    "node-rank",
    "max-restarts",
    "monitor-interval",
    "start-method",
    "role",
    "log-dir",
    "redirects",
    "tee",
    "local-addr",
)
"""torchrun options (with a value) that have no use here: they are read and dropped."""


@dataclass(frozen=True)
class TorchRun:
    """What a torchrun command line asks for."""

    nnodes: int
    nproc_per_node: int
    script_args: tuple[str, ...]
    """``("train.py", ...)`` or ``("-m", "pkg.train", ...)``, as ``SPMDActor.main`` takes."""


def parse_torchrun(argv: Sequence[str]) -> TorchRun:
    """Read a ``torchrun ...`` (or ``python -m torch.distributed.run ...``) command line."""
    args = list(argv)
    if args[:1] == ["torchrun"]:
        args = args[1:]
    elif args[1:3] == ["-m", "torch.distributed.run"]:
        args = args[3:]
    else:
        raise ValueError(f"not a torchrun command line: {list(argv)!r}")
    parser = argparse.ArgumentParser(prog="torchrun", add_help=False, exit_on_error=False)
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    parser.add_argument("-m", "--module", action="store_true")
    parser.add_argument("--no-python", "--no_python", action="store_true")
    parser.add_argument("--standalone", action="store_true")
    for ignored in _IGNORED:  # Monarch names the rendezvous and watches the procs
        parser.add_argument(f"--{ignored}", f"--{ignored.replace('-', '_')}")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    try:
        known = parser.parse_args(args)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ValueError(f"cannot read the torchrun command line {list(argv)!r}: {exc}") from None
    if known.no_python:
        raise ValueError("--no-python: the script must be Python (it runs in the procs)")
    nnodes = _count(known.nnodes.rpartition(":")[2], "--nnodes")  # MIN:MAX: the most
    per_node = _count(known.nproc_per_node, "--nproc-per-node")
    head = ("-m", known.script) if known.module else (known.script,)
    return TorchRun(nnodes, per_node, (*head, *known.script_args))


def _count(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{flag} must be a positive number here, not {text!r}")
    return int(text)


class SPMDJob(JobTrait):
    """A torchrun job: hosts from ``job`` (its mesh ``hosts``), the script run on all of
    them by ``run_spmd()``, again and again on the same hosts."""

    def __init__(self, job: JobTrait, run: TorchRun) -> None:
        super().__init__()
        self._job = job
        self._run = run
        self._hosts: JobState | None = None
        """The hosts as this process attached to them (not saved), for the next run."""

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        state.pop("_hosts", None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        super().__setstate__(state)
        self._hosts = None

    @property
    def torchrun(self) -> TorchRun:
        return self._run

    def run_spmd(self, cached_path: str | None = None) -> None:
        """Run the script once on every proc (``nproc_per_node`` per host) and return when
        all finished; a failing rank raises its error. The hosts stay for the next run."""
        from monarch.spmd import SPMDActor

        if self._hosts is None or not self._attached:
            self._hosts = self.state(cached_path)
        procs = self._hosts.hosts.spawn_procs(per_host={"gpus": self._run.nproc_per_node})
        try:
            actors = procs.spawn("spmd", SPMDActor)
            first = actors.slice(**dict.fromkeys(procs.extent.labels, 0))
            addr, port = first.get_host_port.call_one(True).get(timeout=60)
            done = actors.main.call(addr, port, list(self._run.script_args)).get()
            failed = [point for point, ok in done.items() if not ok]
            if failed:
                raise JobError(f"the script exited with a non-zero status on {failed}")
        finally:
            procs.stop().get(timeout=60)

    def _spec(self) -> object:
        return type(self._job), self._job._spec(), self._run

    def _create(self, client_script: str | None) -> None:
        self._job.apply(client_script)

    def _state(self) -> JobState:
        return self._job._state()

    def _is_running(self) -> bool:
        return self._job._is_running()

    def _kill(self) -> None:
        self._job._kill()


_LAUNCHERS: Final = ("torchrun", "torch.distributed.run", "python", "python3")


def _from_appdef(appdef: Any) -> tuple[TorchRun, dict[str, str]]:
    """What a torchx ``AppDef`` of one role asks for, and its role's environment: its
    ``num_replicas`` hosts, each running the role's command line (``torchrun ...``, or
    ``python script.py ...``: one proc a host). An entrypoint that is a wrapper script
    (``workspace/entrypoint.sh``) is left out: its arguments are the command line, as
    upstream reads them."""
    roles = list(appdef.roles)
    if len(roles) != 1:
        raise ValueError(f"SPMD jobs have one role; this AppDef has {len(roles)}")
    role = roles[0]
    entrypoint = str(role.entrypoint)
    argv = [str(arg) for arg in role.args]
    if entrypoint.rpartition("/")[2] in _LAUNCHERS:
        argv = [entrypoint.rpartition("/")[2], *argv]
    if not argv:
        raise ValueError(f"the AppDef's role {role.name!r} has no command line")
    nnodes = int(role.num_replicas)
    if nnodes < 1:
        raise ValueError(f"the AppDef's role {role.name!r} has num_replicas={nnodes}")
    if argv[0] in ("python", "python3") and argv[1:3] not in (
        ["-m", "torch.distributed.run"],
        ["-m", "torchrun"],
    ):
        run = TorchRun(nnodes, 1, tuple(argv[1:]))  # a plain script: one proc a host
    else:
        if argv[1:3] == ["-m", "torchrun"]:
            argv = ["torchrun", *argv[3:]]
        parsed = parse_torchrun(argv)
        run = TorchRun(nnodes, parsed.nproc_per_node, parsed.script_args)
    if not run.script_args:
        raise ValueError(f"the AppDef's role {role.name!r} names no script")
    return run, {str(k): str(v) for k, v in dict(role.env or {}).items()}


def serve(
    appdef: Sequence[str] | Any,
    scheduler: str = "mast_conda",
    scheduler_cfg: Mapping[str, Any] | None = None,
) -> SPMDJob:
    """An ``SPMDJob`` for a torchrun command line (``["torchrun", "--nnodes=2",
    "--nproc-per-node=8", "train.py", ...]``) or a torchx ``AppDef`` of one role (its
    ``num_replicas`` hosts). ``scheduler``: ``"local"`` or ``"local_cwd"`` (worker
    processes on this machine, in the current directory, ``ProcessJob``), ``"slurm"``
    (``SlurmJob``; ``scheduler_cfg`` holds its keyword arguments), ``"ssh"`` (``SSHJob``;
    ``scheduler_cfg["hosts"]``, one per node, and its other keyword arguments) or
    ``"kubernetes"`` (``KubernetesJob``: ``namespace``, ``timeout``, ``kubeconfig``; the
    rest are ``add_mesh``'s, e.g.
    ``image_spec``, for its mesh of ``--nnodes`` pods). Not started yet: ``run_spmd()`` or
    ``state()`` start it."""
    env: dict[str, str] = {}
    if hasattr(appdef, "roles"):
        run, env = _from_appdef(appdef)
    elif isinstance(appdef, Sequence) and not isinstance(appdef, str):
        run = parse_torchrun([str(arg) for arg in appdef])
    else:
        raise TypeError(
            "appdef: a torchrun command line as a list of strings, or a torchx AppDef "
            f"(pip install 'monarch-jobs[torchx]'), not {type(appdef).__name__}"
        )
    cfg = dict(scheduler_cfg or {})
    job: JobTrait
    if scheduler in ("local", "local_cwd"):  # worker processes here, in this directory
        if env:
            cfg["env"] = {**env, **cfg.get("env", {})}
        job = ProcessJob({"hosts": run.nnodes}, **cfg)
    elif scheduler == "slurm":
        job = SlurmJob({"hosts": run.nnodes}, **cfg)
    elif scheduler == "ssh":
        hosts = list(cfg.pop("hosts", []))
        if len(hosts) != run.nnodes:
            raise ValueError(
                f"scheduler_cfg['hosts'] names {len(hosts)} hosts for --nnodes={run.nnodes}"
            )
        job = SSHJob(hosts, **cfg)
    elif scheduler == "kubernetes":
        from .kubernetes import KubernetesJob  # on use: it needs the kubernetes client

        if "namespace" not in cfg:
            raise ValueError("scheduler_cfg['namespace']: the Kubernetes namespace of the pods")
        kube = KubernetesJob(**{key: cfg.pop(key) for key in _KUBE_JOB_ARGS if key in cfg})
        kube.add_mesh("hosts", run.nnodes, **cfg)
        job = kube
    else:
        raise ValueError(
            f"scheduler {scheduler!r} is not offered here (upstream's default, mast_conda, is "
            f"Meta's own): use one of {', '.join(SCHEDULERS)}"
        )
    return SPMDJob(job, run)


__all__ = ["SPMDJob", "StoreJob", "TorchRun", "parse_torchrun", "serve"]
