"""``LocalJob`` (every mesh is this machine) and ``ProcessJob`` (local worker processes
acting as hosts, which outlive the script that started them, so that its next run
re-attaches to them)."""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from monarch.core import (
    SECRET_ENV,
    current_runtime,
    job_secret,
    this_host,
)
from monarch.core.lowlevel import process_alive, process_start

from ._fork import Forker, can_fork
from ._state import JobState, attached_state
from ._trait import BATCH_ENV, JobError, JobTrait, checked_meshes, no_batch_mode

START_TIMEOUT: Final = 60.0
"""Seconds a worker has to say it listens."""
WORKER: Final = (sys.executable, "-m", "monarch.core.worker")
"""``monarch worker`` without the command's plug-in discovery (see ``_worker``)."""
LISTEN_POLL: Final = 0.002
"""Seconds between looks at a starting worker's log: a worker listens ~0.15 s after the
job's start, and each look costs microseconds (10 ms cost the first replies 5 ms)."""
KILL_GRACE: Final = 10.0
"""Seconds a worker's process group has to end after SIGTERM before SIGKILL."""


class LocalJob(JobTrait):
    """Each named mesh is this machine (``this_host()``): a script's own procs. With
    ``apply(client_script=...)`` it runs the script in the background (a session of its
    own, its output in ``log_dir``); ``kill()`` ends it."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        if isinstance(hosts, str):
            hosts = (hosts,)
        self._names = tuple(hosts)
        self.log_dir: str | None = None
        """Where the client ``apply(client_script=...)`` started writes its output."""
        self._client: int | None = None
        """That client's pid (it leads its session)."""
        self._process: subprocess.Popen[bytes] | None = None

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        state.pop("_process", None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        super().__setstate__({"log_dir": None, "_client": None, **state})  # older saves
        self._process = None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The client ``apply(client_script=...)`` started (upstream's), in this process."""
        if self._process is None:
            raise ValueError("no local batch job: apply(client_script=...) starts one")
        return self._process

    def _spec(self) -> object:
        return self._names

    def _create(self, client_script: str | None) -> None:
        if client_script is None:
            return  # this machine exists already
        Path(".monarch/logs").mkdir(parents=True, exist_ok=True)
        # Absolute on every Python (3.12's mkdtemp makes it so; 3.11's kept it relative,
        # wrong once the script changes its directory).
        self.log_dir = os.path.abspath(tempfile.mkdtemp(prefix="job_", dir=".monarch/logs"))
        env = {**os.environ, BATCH_ENV: "1"}
        with (
            open(os.path.join(self.log_dir, "stdout.log"), "wb") as out,
            open(os.path.join(self.log_dir, "stderr.log"), "wb") as err,
        ):
            self._process = subprocess.Popen(
                [sys.executable, *shlex.split(client_script)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # outlives this script
            )
        self._client = self._process.pid
        print(
            f"Started client script {client_script} with PID: {self._client}; "
            f"its output: {self.log_dir}",
            file=sys.stderr,
        )

    def _state(self) -> JobState:
        host = this_host()
        return JobState(dict.fromkeys(self._names, host))

    def _is_running(self) -> bool:
        return False  # this machine's procs belong to the script that spawned them

    def _kill(self) -> None:
        if self._client is None:
            return
        if self._process is None:  # another process started it
            _end_groups([self._client])
        else:  # its Popen reaps it (and keeps its status)
            _signal(self._client, signal.SIGTERM)
            try:
                self._process.wait(KILL_GRACE)
            except subprocess.TimeoutExpired:
                _signal(self._client, signal.SIGKILL)
                self._process.wait()
        self._client = None


class _Worker:
    """One worker process of a ProcessJob: where it listens, its pid, its log, and its
    start time (pid and start time name one process: pids are reused)."""

    def __init__(self, address: str, pid: int, log: str) -> None:
        self.address = address
        self.pid = pid
        self.log = log
        self.start = process_start(pid)

    def running(self) -> bool:
        """Alive (not a zombie) and still the worker we started."""
        return process_alive(self.pid, getattr(self, "start", None))

    def exit_status(self) -> int | None:
        """Its exit status if it has ended (it is this process's child), else None."""
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None if self.running() else -1
        return os.waitstatus_to_exitcode(status) if pid else None


class ProcessJob(JobTrait):
    """``meshes``: hosts per mesh name (``{"hosts": 2}``); each host is a ``monarch worker``
    on this machine, in a session of its own, logging to a file (``logs``): all forked
    from one fresh Python (``_fork``), or each started as a program."""

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._meshes = checked_meshes(meshes, "hosts")
        self._env = dict(env or {})
        self._id = secrets.token_hex(6)
        self._secret = b""
        self._workers: dict[str, list[_Worker]] = {}

    @property
    def logs(self) -> Path:
        """The folder of the workers' logs (their output and their procs')."""
        return Path(tempfile.gettempdir()) / f"monarch-job-{self._id}"

    def _spec(self) -> object:
        return self._meshes, self._env

    def _create(self, client_script: str | None) -> None:
        no_batch_mode(self, client_script)
        self._secret = job_secret()
        self.logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {**os.environ, **self._env, SECRET_ENV: self._secret.hex()}
        names = [name for name, count in self._meshes.items() for _ in range(count)]
        ranks = [rank for count in self._meshes.values() for rank in range(count)]
        specs = [
            (f"unix://@monarch-job-{self._id}-{name}-{rank}", str(self.logs / f"{name}-{rank}.log"))
            for name, rank in zip(names, ranks, strict=True)
        ]
        forker: Forker | None = None
        pids: list[int] = []
        try:
            if can_fork():
                for _, log in specs:
                    Path(log).touch(0o600)  # there before the worker: the client reads it
                forker = Forker(specs, env, str(self.logs / "forker.log"))
            else:
                for address, log in specs:
                    pids.append(_run_worker(address, log, env))
            if self._attaching:
                current_runtime()  # the client's own start, while the workers start theirs
            if forker is not None:
                pids = forker.wait_pids(START_TIMEOUT)
            started = [
                _Worker(address, pid, log) for (address, log), pid in zip(specs, pids, strict=True)
            ]
            for worker in started:
                _wait_listening(worker)
        except BaseException:
            _end_groups(forker.abandon() if forker is not None else pids)
            raise
        self._workers = {name: [] for name in self._meshes}
        for name, worker in zip(names, started, strict=True):
            self._workers[name].append(worker)

    def _state(self) -> JobState:
        addresses = {name: [w.address for w in ws] for name, ws in self._workers.items()}
        return attached_state(self._secret, addresses)

    def _is_running(self) -> bool:
        workers = [w for ws in self._workers.values() for w in ws]
        return bool(workers) and all(w.running() for w in workers)

    def _kill(self) -> None:
        running = [w.pid for ws in self._workers.values() for w in ws if w.running()]
        _end_groups(running)


def _run_worker(address: str, log: str, env: Mapping[str, str]) -> int:
    """Start a worker as a program (``python -m monarch.core.worker``); its pid."""
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [*WORKER, "--listen", address],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this script
        )
    popen.returncode = 0  # it outlives this script: no "still running" warning for it
    return popen.pid


def _wait_listening(worker: _Worker) -> None:
    """Return once the worker printed its address (the first line of its log)."""
    deadline = time.monotonic() + START_TIMEOUT
    expected = worker.address.encode() + b"\n"
    while True:
        with open(worker.log, "rb") as log:
            if log.readline() == expected:
                return
        status = worker.exit_status()
        if status is not None:
            raise JobError(
                f"worker {worker.address} exited with {status} before it listened: "
                f"{_tail(worker.log)}"
            )
        if time.monotonic() > deadline:
            raise JobError(f"worker {worker.address} did not listen within {START_TIMEOUT:g}s")
        time.sleep(LISTEN_POLL)


def _tail(path: str, size: int = 2000) -> str:
    with open(path, "rb") as log:
        return log.read()[-size:].decode(errors="replace").strip()


def _end_groups(pids: list[int]) -> None:
    """SIGTERM the workers' process groups (each worker and its procs), all at once (an
    interruption while waiting leaves none of them unasked), then SIGKILL what is left
    after ``KILL_GRACE``. A worker forked a moment ago may not lead its group yet: it is
    signalled itself."""
    left = [pid for pid in pids if _signal(pid, signal.SIGTERM)]
    deadline = time.monotonic() + KILL_GRACE
    while left and time.monotonic() < deadline:
        for pid in list(left):
            _reap(pid)
            if not process_alive(pid):
                left.remove(pid)  # its procs die with it (and had the SIGTERM too)
        if left:
            time.sleep(0.02)
    for pid in left:
        _signal(pid, signal.SIGKILL)
        _reap(pid)


def _signal(pid: int, signum: int) -> bool:
    """Send ``signum`` to the group ``pid`` leads, else to ``pid``; whether either exists."""
    try:
        os.killpg(pid, signum)
        return True
    except ProcessLookupError:
        pass
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child (started by an earlier run of the script)
