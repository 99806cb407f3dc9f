"""``SlurmJob``: host meshes allocated by Slurm, one batch job per mesh.

Each mesh is an ``sbatch`` job of that many nodes whose one step runs ``monarch worker``
on every node (``srun``). The workers read the job secret from a file (mode 0600) in the
job's folder, which the nodes share with the client (the submit directory, as usual on a
cluster), and print their addresses into it, one file per node; the client attaches to
them. Slurm's own commands are driven as a user would (sbatch, squeue, scancel): a failing
one's stderr is the error.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from monarch.actor import attach_to_workers
from monarch.core import HostMesh, job_secret, use_job_secret

from ._state import JobState
from ._trait import (
    BATCH_ENV,
    DEFAULT_JOB_PATH,
    JobError,
    JobTrait,
    checked_meshes,
    in_batch_job,
    write_private,
)

START_TIMEOUT: Final = 300.0
"""Seconds for an allocation to start and its workers to listen (``start_timeout``)."""

LOOK_EVERY: Final = 0.02
"""Seconds between looks at the workers' output files while they start."""
SQUEUE_EVERY: Final = 0.5
"""Seconds between asking squeue whether the job still runs, meanwhile."""
_ADDRESS: Final = re.compile(r"[a-z][a-z0-9+.\-]*://\S+")
"""What a worker's first line is when it listens (else it is why it could not)."""

log = logging.getLogger("monarch.job")


class SlurmJob(JobTrait):
    """``meshes``: nodes per mesh name. The keyword arguments are upstream's; ``slurm_args``
    are passed to sbatch as they are. ``start_timeout`` (ours): seconds for the allocations
    to start and their workers to listen; a job still pending then (squeue's reason said
    meanwhile, e.g. more nodes than its partition has) is cancelled and the call fails."""

    def __init__(
        self,
        meshes: Mapping[str, int],
        python_exe: str = "python",
        slurm_args: Sequence[str] = (),
        monarch_port: int = 22222,
        job_name: str = "monarch_job",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        *,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        super().__init__()
        if not start_timeout > 0:
            raise ValueError(f"start_timeout must be positive seconds, not {start_timeout!r}")
        self._start_timeout = start_timeout
        self._meshes = checked_meshes(meshes, "nodes")
        if ntasks_per_node != 1:
            raise ValueError("ntasks_per_node: one worker runs per node (procs are spawned on it)")
        self._python = python_exe
        self._port = monarch_port
        self._sbatch = [f"--job-name={job_name}", "--ntasks-per-node=1", *slurm_args]
        for flag, value in (
            ("--time", time_limit),
            ("--partition", partition),
            ("--gpus-per-node", gpus_per_node),
            ("--cpus-per-task", cpus_per_task),
            ("--mem", mem),
        ):
            if value is not None:
                self._sbatch.append(f"{flag}={value}")
        if exclusive:
            self._sbatch.append("--exclusive")
        self._id = secrets.token_hex(6)
        self._folder = Path(log_dir or ".monarch").absolute() / f"slurm-{self._id}"
        self._secret = b""
        self._jobs: dict[str, str] = {}
        """Slurm job ids by mesh name."""
        self._batch = False
        """Runs its client itself (``apply(client_script=...)``)."""

    def _spec(self) -> object:
        return self._meshes, self._python, self._port, self._sbatch

    def _create(self, client_script: str | None) -> None:
        if client_script is not None and len(self._meshes) != 1:
            raise JobError(
                "apply(client_script=...) runs the client in the job's allocation: a SlurmJob "
                f"of one mesh (this one has {len(self._meshes)})"
            )
        self._secret = job_secret()
        self._folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        secret_file = self._folder / "secret"
        write_private(secret_file, self._secret.hex().encode())
        if client_script is not None:
            # Saved before it is submitted: its client may start at once, and attaches to
            # the job this file holds (its id comes from the allocation's environment).
            self._batch = True
            self.dump(DEFAULT_JOB_PATH)
        try:
            for name, nodes in self._meshes.items():
                self._jobs[name] = self._submit(name, nodes, secret_file, client_script)
        except BaseException:
            self._kill()
            raise
        if client_script is not None:
            self.dump(DEFAULT_JOB_PATH)  # with its job id: job_load().kill() here ends it

    def _job_ids(self) -> dict[str, str]:
        """Slurm job ids by mesh name; in the client a batch job runs, its allocation's."""
        if not self._jobs and self._batch and in_batch_job() and "SLURM_JOB_ID" in os.environ:
            return dict.fromkeys(self._meshes, os.environ["SLURM_JOB_ID"])
        return self._jobs

    def can_run(self, spec: JobTrait) -> bool:
        """In the client a batch job runs, the job it runs in (as upstream's BatchJob)."""
        return (self._batch and in_batch_job()) or super().can_run(spec)

    def _submit(self, name: str, nodes: int, secret_file: Path, client_script: str | None) -> str:
        worker = shlex.join(
            [
                self._python,
                "-m",
                "monarch.core.worker",
                "--listen",
                f"tcp://*:{self._port}",
                "--secret-file",
                str(secret_file),
            ]
        )
        out = self._folder / f"{name}-%t.out"  # one per node (task), first line its address
        # The batch script starts once the allocation is granted: it says when, and where.
        granted = 'echo "monarch: allocated at $(date +%s.%N) on $SLURM_JOB_NODELIST"'
        srun = f"srun --output={shlex.quote(str(out))} {worker}"
        if client_script is None:
            script = f"#!/bin/sh\n{granted}\nexec {srun}\n"
        else:  # the workers in the background, the client; the job ends with the client
            client = shlex.join([self._python, *shlex.split(client_script)])
            script = f"#!/bin/sh\n{granted}\n{srun} &\n{BATCH_ENV}=1 exec {client}\n"
        argv = [
            "sbatch",
            "--parsable",
            f"--nodes={nodes}",
            f"--output={self._folder / f'{name}-batch.out'}",
            *self._sbatch,
        ]
        done = _run(argv, script)
        return done.split(";")[0]

    def _addresses(self, name: str, deadline: float) -> list[str]:
        """The addresses the mesh's workers printed, once every node's worker has."""
        job = self._job_ids()[name]
        files = [self._folder / f"{name}-{task}.out" for task in range(self._meshes[name])]
        asked = -SQUEUE_EVERY  # when squeue was last asked (it costs a process, and slurmctld)
        said = ""  # the pending reason last told
        while True:
            found: list[str] = []
            for path in files:
                try:
                    with open(path) as out:
                        line = out.readline()
                except FileNotFoundError:
                    break
                if not line.endswith("\n"):
                    break
                if not _ADDRESS.fullmatch(line.strip()):
                    raise JobError(
                        f"Slurm job {job} (mesh {name!r}): the worker of node {len(found)} "
                        f"did not start: {line.strip()} (its output: {path})"
                    )
                found.append(line.strip())
            if len(found) == len(files):
                return found
            if time.monotonic() - asked < SQUEUE_EVERY:
                time.sleep(LOOK_EVERY)
                continue
            asked = time.monotonic()
            state, reason = _job_state(job)
            if state not in ("PENDING", "CONFIGURING", "RUNNING"):
                batch = self._folder / f"{name}-batch.out"
                text = batch.read_text()[-2000:] if batch.exists() else ""
                raise JobError(f"Slurm job {job} (mesh {name!r}) is {state or 'gone'}: {text}")
            why = f" ({reason})" if state == "PENDING" and reason else ""
            if state == "PENDING" and reason != said:
                said = reason
                log.warning(
                    "Slurm job %s (mesh %r, %d nodes) is pending: %s",
                    job,
                    name,
                    len(files),
                    reason or "no reason given",
                )
            if time.monotonic() > deadline:
                raise JobError(
                    f"Slurm job {job} (mesh {name!r}, {len(files)} nodes): its workers did not "
                    f"start within start_timeout ({self._start_timeout:g}s); it was "
                    f"{state}{why}, and is cancelled"
                )
            time.sleep(LOOK_EVERY)

    def _state(self) -> JobState:
        use_job_secret(self._secret)
        deadline = time.monotonic() + self._start_timeout
        hosts: dict[str, HostMesh] = {}
        try:
            for name in self._meshes:
                addresses = self._addresses(name, deadline)
                hosts[name] = attach_to_workers(workers=addresses, name=name)
        except JobError:
            self._kill()  # nothing left queued for an allocation nobody waits for
            raise
        return JobState(hosts)

    def _is_running(self) -> bool:
        jobs = self._job_ids()
        return bool(jobs) and all(_job_state(j)[0] == "RUNNING" for j in jobs.values())

    def _kill(self) -> None:
        jobs = self._job_ids()
        if jobs:
            _run(["scancel", *set(jobs.values())])


def _run(argv: list[str], stdin: str | None = None) -> str:
    """A Slurm command's output; its stderr as the error when it fails."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise JobError(f"{argv[0]} not found: is this a Slurm login node?") from None
    if done.returncode != 0:
        raise JobError(f"{shlex.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def _job_state(job: str) -> tuple[str, str]:
    """The job's state and its reason as squeue says them (``("", "")`` once Slurm has
    forgotten it; the reason is ``None`` where there is none, e.g. a running job)."""
    try:
        state, _, reason = _run(["squeue", "-h", "-j", job, "-o", "%T|%r"]).partition("|")
    except JobError as exc:
        if "Invalid job id" in str(exc):
            return "", ""
        raise
    return state, "" if reason == "None" else reason
