"""``StoreJob`` (upstream's ``monarch.job.spmd.StoreJob``): the hosts of a torchrun-style
job, found through its rendezvous store.

Every rank calls ``StoreJob.from_store(store)`` (a ``torch.distributed.Store``, or anything
with its ``set``/``get``). The first rank of each host (LOCAL_RANK 0) starts a ``monarch
worker`` there, which ends with that rank (``_store_worker``), and publishes the address
it listens at under ``monarch/spmd/workers/<host>``; global rank 0 reads every host's and
gets a ``StoreJob`` of them (the other ranks get None), whose ``state()`` attaches. The job
secret is ``MONARCH_JOB_SECRET`` where the launcher gave every rank the same one; else
rank 0 makes one and hands it to the others through the store (where anyone who reaches
the store can read it: upstream's workers accept any connection at all).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from typing import Final, Protocol

from monarch.core import SECRET_ENV, job_secret

from ._state import JobState, attached_state
from ._trait import JobError, JobTrait, no_batch_mode

SECRET_KEY: Final = "monarch/spmd/secret"
TRANSPORTS: Final = ("ipc", "tcp")
START_TIMEOUT: Final = 60.0
"""Seconds a worker has to say it listens."""
_ADDRESS: Final = re.compile(rb"[a-z][a-z0-9+.\-]*://\S+\n")
_started: list[subprocess.Popen[bytes]] = []
"""The workers this rank started (kept: they end with it)."""


class StoreLike(Protocol):
    """What of ``torch.distributed.Store`` the rendezvous uses."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...


def worker_key(host: int) -> str:
    return f"monarch/spmd/workers/{host}"


class StoreJob(JobTrait):
    """One mesh (``name``) of the workers at ``worker_addrs``, in host order; made by
    ``from_store``. The torchrun job owns the workers: ``kill()`` stops the procs this
    client spawned, and the workers end with their ranks."""

    def __init__(self, worker_addrs: list[str], name: str, secret: bytes | None = None) -> None:
        super().__init__()
        if not name.isidentifier():
            raise ValueError(f"name: a mesh name must be an identifier, not {name!r}")
        self._worker_addrs = list(worker_addrs)
        self._name = name
        self._secret = secret if secret is not None else job_secret()

    @classmethod
    def from_store(
        cls,
        store: StoreLike,
        *,
        monarch_port: int = 0,
        name: str = "monarch_worker",
        transport: str = "ipc",
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        local_world_size: int | None = None,
    ) -> StoreJob | None:
        """Called by every rank (see the module docstring); the job on global rank 0, else
        None. The topology defaults to torchrun's RANK, LOCAL_RANK, WORLD_SIZE and
        LOCAL_WORLD_SIZE. ``transport``: ``"ipc"`` (one host) or ``"tcp"``, on
        ``monarch_port`` (0: any free port; the worker says which)."""
        if transport not in TRANSPORTS:
            raise ValueError(
                f"transport {transport!r} is not offered here: use one of {', '.join(TRANSPORTS)}"
            )
        if type(monarch_port) is not int or not 0 <= monarch_port < 65536:
            raise ValueError(f"monarch_port must be a port number, not {monarch_port!r}")
        if not name.isidentifier():
            raise ValueError(f"name: a mesh name must be an identifier, not {name!r}")
        global_rank = _topology(rank, "RANK")
        local = _topology(local_rank, "LOCAL_RANK")
        world = _topology(world_size, "WORLD_SIZE")
        per_host = _topology(local_world_size, "LOCAL_WORLD_SIZE")
        if per_host < 1 or world % per_host:
            raise ValueError(
                f"WORLD_SIZE ({world}) must be a multiple of LOCAL_WORLD_SIZE ({per_host})"
            )
        host = global_rank // per_host
        secret = _secret(store, global_rank, local)
        if local == 0:
            if transport == "ipc":
                url = f"unix://@monarch-store-{name}-{host}-{secrets.token_hex(6)}"
            else:
                url = f"tcp://*:{monarch_port}"
            store.set(worker_key(host), start_worker(url, secret, f"{name}-{host}"))
        if global_rank != 0:
            return None
        addresses = [store.get(worker_key(h)).decode() for h in range(world // per_host)]
        return cls(addresses, name, secret)

    def state(self, cached_path: str | None = None) -> JobState:
        """Attach to the workers (nothing is saved: the torchrun job owns them)."""
        return super().state(cached_path)

    def _spec(self) -> object:
        return self._worker_addrs, self._name

    def can_run(self, spec: JobTrait) -> bool:
        return False

    def _create(self, client_script: str | None) -> None:
        no_batch_mode(self, client_script)
        # the workers run already

    def _state(self) -> JobState:
        return attached_state(self._secret, {self._name: self._worker_addrs})

    def _is_running(self) -> bool:
        return self.active

    def _kill(self) -> None:
        pass  # the workers end with their ranks


def _topology(value: int | None, variable: str) -> int:
    if value is not None:
        return value
    text = os.environ.get(variable)
    if text is None:
        raise JobError(
            f"StoreJob.from_store needs {variable} (torchrun sets RANK, LOCAL_RANK, "
            "WORLD_SIZE and LOCAL_WORLD_SIZE) or the matching keyword argument"
        )
    return int(text)


def _secret(store: StoreLike, rank: int, local_rank: int) -> bytes:
    """The job secret: the launcher's (the same in every rank's environment), else rank
    0's, through the store. Only rank 0 (the client) and the ranks that start a worker
    need it."""
    if os.environ.get(SECRET_ENV):
        return job_secret()
    if rank == 0:
        secret = job_secret()
        store.set(SECRET_KEY, secret.hex())
        return secret
    if local_rank != 0:
        return b""
    return bytes.fromhex(store.get(SECRET_KEY).decode())


def start_worker(url: str, secret: bytes, label: str) -> str:
    """Start this host's worker (a child of this rank, ending with it); the address it
    listens at, once it does. Its output goes to a file in the temporary directory."""
    fd, log = tempfile.mkstemp(prefix=f"monarch-store-{label}-", suffix=".log")
    env = {**os.environ, SECRET_ENV: secret.hex()}
    argv = [sys.executable, "-m", "monarch.job._store_worker", str(os.getpid()), "--listen", url]
    with os.fdopen(fd, "wb") as out:
        worker = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    _started.append(worker)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        with open(log, "rb") as out:
            line = out.readline()
        if _ADDRESS.fullmatch(line):
            return line.decode().strip()
        if worker.poll() is not None:
            with open(log, "rb") as out:
                said = out.read()[-2000:].decode(errors="replace").strip()
            raise JobError(f"the worker at {url} exited ({worker.returncode}): {said}")
        if time.monotonic() > deadline:
            raise JobError(f"the worker at {url} did not listen within {START_TIMEOUT:g}s")
        time.sleep(0.01)
