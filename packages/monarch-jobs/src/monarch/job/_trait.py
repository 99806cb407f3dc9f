"""``JobTrait``: a declarative job whose state a later run of the same script re-attaches to.

A job says which host meshes it wants (``{"trainers": 2}``); ``apply()`` makes them
exist (starts workers, submits to a scheduler); ``state()`` returns a ``JobState`` with one
``HostMesh`` per name. ``state(cached_path=...)`` first looks for the same job saved by an
earlier run: if its hosts still run, it attaches to them instead of starting new ones,
and otherwise starts afresh (saying why). The saved job is a pickle of the job object; it
holds the job secret, so it is written with mode 0600.
"""

from __future__ import annotations

import os
import pickle
import shlex
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from monarch.core import HostMesh, workers_stopping

from ._extras import optional
from ._mounts import GatherMount, Mounts, RemoteMount
from ._state import JobState

if TYPE_CHECKING:  # imported on use: importing OpenTelemetry costs a client that has no need
    from monarch.admin import AdminServer, MeshAdminConfig
    from monarch.telemetry import TelemetryConfig

DEFAULT_JOB_PATH: Final = ".monarch/job_state.pkl"
BATCH_ENV: Final = "MONARCH_BATCH_JOB"
"""Set (to 1) for a client that a job runs itself (``apply(client_script=...)``)."""
STOP_TIMEOUT: Final = 30.0
"""Seconds ``kill()`` gives the procs of this process to stop before ending the hosts."""
_TRANSIENT: Final = (
    "_attaching",
    "_attached",
    "_telemetry",
    "_mounts",
    "_last_hosts",
    "_admin",
    "_admin_server",
)
"""What a saved job leaves out: it belongs to the process that attached."""
FORMAT: Final = 1
"""The saved job's format: one saved by another version is not loaded (a fresh start)."""


class JobError(RuntimeError):
    """A job that cannot be started, reached or loaded (the message says why)."""


class JobTrait(ABC):
    """What every job (local, processes, Slurm...) offers; a subclass says how its hosts
    come to be (``_create``), are reached (``_state``), checked and ended."""

    def __init__(self) -> None:
        self._running = False
        self._attaching = False
        """True while ``state()`` applies the job: it attaches next, so a backend may
        start this process's runtime while its hosts start."""
        self._attached: list[HostMesh] = []
        """The host meshes this process attached to (not saved): ``kill()`` stops their
        procs first, so that their end is no failure that ends this client halfway."""
        self._telemetry: TelemetryConfig | None = None
        """Keep the job's telemetry tables in this client (``enable_telemetry``; not saved:
        each client that attaches asks for its own)."""
        self._mounts = Mounts()
        """``remote_mount``/``gather_mount`` (not saved: each client declares its own)."""
        self._last_hosts: dict[str, HostMesh] = {}
        """The meshes ``state()`` attached to, as the job made them (for the mounts)."""
        self._admin: MeshAdminConfig | None = None
        """Serve the job's admin API from this client (``enable_admin``; not saved)."""
        self._admin_server: AdminServer | None = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(vars(self))
        for transient in _TRANSIENT:
            state.pop(transient, None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        mine = vars(self)
        telemetry, admin, server = (mine.get(k) for k in ("_telemetry", "_admin", "_admin_server"))
        mounts = mine.get("_mounts") or Mounts()
        mine.update(state)
        self._attaching = False
        self._attached = []
        # What this process asked for, kept on re-attaching.
        self._telemetry = telemetry
        self._admin = admin
        self._admin_server = server
        self._mounts = mounts
        self._last_hosts = {}

    # -- the user's API ------------------------------------------------------------------

    def apply(self, client_script: str | None = None) -> None:
        """Make the job's hosts exist. With ``client_script`` (upstream's batch mode: a
        Python script and its arguments, ``"train.py --lr 0.1"``), the job also runs it
        as its client, where the kind of job says (``SlurmJob``: in the allocation;
        ``LocalJob``: in the background here), with ``MONARCH_BATCH_JOB=1``: its
        ``state()`` attaches to this job (saved at ``.monarch/job_state.pkl`` in the
        current folder), and the job ends with it. Kinds that cannot say so."""
        if client_script is not None and (
            type(client_script) is not str or not shlex.split(client_script)
        ):
            raise ValueError(f"client_script: a script and its arguments, not {client_script!r}")
        self._create(client_script)
        self._running = True

    def state(self, cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
        """The job's host meshes, started if need be (see the module docstring)."""
        if cached_path is not None:
            _attached_through[:] = [os.path.realpath(cached_path)]  # the context's own file
            cached = _load_cached(cached_path)
            running = cached is not None and cached._is_running()
            if cached is not None and running and cached.can_run(self):
                print("Job is running, returning current state", file=sys.stderr)
                self.__setstate__(cached.__getstate__())  # this object is the running job now
                return self._attach()
            if cached is None:
                print(f"No cached job found at path: {cached_path}", file=sys.stderr)
            elif running:
                print(
                    f"The cached job at {cached_path} is another job (its hosts still run: "
                    f"job_load({cached_path!r}).kill() ends them); starting anew",
                    file=sys.stderr,
                )
            else:
                print(
                    f"The cached job at {cached_path} no longer runs; starting anew",
                    file=sys.stderr,
                )
                _end_leftovers(cached)
        if not self._running:
            print("Applying current job", file=sys.stderr)
            self._attaching = True
            try:
                self.apply()
            finally:
                self._attaching = False
        print("Job has started, connecting to current state", file=sys.stderr)
        state = self._attach()
        if cached_path is not None:
            print(f"Saving job to cache at {cached_path}", file=sys.stderr)
            self.dump(cached_path)
        return state

    def kill(self) -> None:
        """End the job: its hosts and everything on them. The procs this process spawned
        on them are stopped first (their end is then no supervision failure, which would
        end this client before every host is)."""
        attached, self._attached = self._attached, []
        if self._admin_server is not None:
            self._admin_server.close()
            self._admin_server = None
        for mesh in attached:
            try:
                mesh.stop().get(timeout=STOP_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - the hosts are ended below anyway
                print(f"Could not stop the procs of {mesh!r}: {exc}", file=sys.stderr)
            workers_stopping(mesh.host_agents())  # their end is what we ask for: no warning
        self._kill()
        self._running = False

    def enable_telemetry(self, config: TelemetryConfig | None = None) -> None:
        """Keep the job's telemetry tables (meshes, actors, their status, messages) in this
        client, queried by SQL through ``state().query_engine_client`` (upstream's; see
        monarch-telemetry). Call it before ``state()``: procs spawned before it report
        nothing."""
        # on use: importing OpenTelemetry costs a client that has no need
        TelemetryConfig = optional("monarch.telemetry", "job.enable_telemetry()").TelemetryConfig

        if self._attached:
            raise RuntimeError(
                "call job.enable_telemetry() before job.state(): the job is attached already"
            )
        self._telemetry = config or TelemetryConfig()

    def remote_mount(
        self,
        source: str,
        mntpoint: str | None = None,
        meshes: list[str] | None = None,
        python_exe: str | None = ".venv/bin/python",
        **kwargs: object,
    ) -> None:
        """Make the local directory ``source`` readable at ``mntpoint`` (default: the same
        path) on every host of ``meshes`` (default: all), from the next ``state()`` on
        (upstream's). A copy kept in step by checksum, not a FUSE mount (see ``_mounts``):
        ``refresh_mounts()`` pushes what changed since. With ``source/python_exe``
        present, the state's meshes start procs with the mounted one."""
        if kwargs:
            raise TypeError(f"remote_mount: options {sorted(kwargs)} are FUSE's, not offered")
        self._mounts.remote.append(RemoteMount(source, mntpoint, meshes, python_exe))

    def gather_mount(
        self, remote_mount_point: str, local_mount_point: str, meshes: list[str] | None = None
    ) -> None:
        """Make each host's ``remote_mount_point`` (``$SUBDIR``: the host's key,
        ``hosts_0``) readable at ``local_mount_point/<key>`` here, from the next
        ``state()`` on (upstream's); ``refresh_mounts()`` brings it up to date."""
        self._mounts.gather.append(GatherMount(remote_mount_point, local_mount_point, meshes))

    def refresh_mounts(self) -> list[str]:
        """Push each remote mount's changes to the hosts and gather the hosts' changes
        (ours: the mounts are copies); the gathered local files that changed."""
        if not self._attached:
            raise RuntimeError("call job.state() first: the job is not attached")
        self._mounts.push(self._last_hosts)
        return self._mounts.refresh_gathered(self._last_hosts)

    def enable_admin(self, config: MeshAdminConfig | None = None) -> None:
        """Serve the job's admin API (hosts, procs, actors, stacks; ``monarch top`` and the
        dashboard read it) from this client once ``state()`` is taken: upstream's. Its
        address is ``state().admin_url``; the server prints its token (see monarch-admin)."""
        MeshAdminConfig = optional("monarch.admin", "job.enable_admin()").MeshAdminConfig
        self._admin = config or MeshAdminConfig()

    def _attach(self) -> JobState:
        """``_state()``, remembering its meshes for ``kill()``; with telemetry enabled, the
        state's ``query_engine_client``; with the admin server, its ``admin_url``."""
        if self._telemetry is not None:
            telemetry = optional("monarch.telemetry", "job.enable_telemetry()")
            engine = telemetry.enable_telemetry(self._telemetry)  # before any proc is spawned
        state = self._state()
        self._attached = list({id(mesh): mesh for mesh in state._hosts.values()}.values())
        self._last_hosts = dict(state._hosts)
        state._hosts = self._mounts.apply(state._hosts)
        if self._telemetry is not None:
            state.query_engine_client = engine
        dashboard = self._telemetry is not None and self._telemetry.include_dashboard
        if self._admin is not None or dashboard:
            if self._admin_server is None:
                start_admin = optional("monarch.admin", "the job's admin server").start_admin
                query = engine.query if self._telemetry is not None else None
                assert self._telemetry is not None or self._admin is not None
                # The admin server serves the dashboard page too (monarch-admin): with
                # only the dashboard asked for, at its port (upstream's 8265), loopback.
                addr = (
                    self._admin.admin_addr
                    if self._admin is not None
                    else f"127.0.0.1:{self._telemetry.dashboard_port}"  # type: ignore[union-attr]
                )
                self._admin_server = start_admin(addr, query=query)
            server = self._admin_server
            if self._admin is not None:
                state.admin_url = server.url
            if dashboard:
                state.dashboard_url = f"{server.url}/?token={server.token}"
        return state

    @property
    def active(self) -> bool:
        return self._running

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this (saved) job provides what ``spec`` asks for (the same meshes)."""
        return type(spec) is type(self) and spec._spec() == self._spec()

    def dumps(self) -> bytes:
        return pickle.dumps((FORMAT, self))

    def dump(self, filename: str | os.PathLike[str] | IO[bytes]) -> None:
        if isinstance(filename, str | os.PathLike):
            write_private(Path(filename), self.dumps())
        else:
            filename.write(self.dumps())

    # -- what a kind of job provides ---------------------------------------------------

    @abstractmethod
    def _spec(self) -> object:
        """What the job asks for, comparable between a saved job and a new one."""

    @abstractmethod
    def _create(self, client_script: str | None) -> None:
        """Start the hosts."""

    @abstractmethod
    def _state(self) -> JobState:
        """Reach the running hosts."""

    @abstractmethod
    def _is_running(self) -> bool:
        """Whether the hosts still run (a saved job may outlive them)."""

    @abstractmethod
    def _kill(self) -> None:
        """Stop the hosts."""


def in_batch_job() -> bool:
    """Whether this process is the client a job runs itself (``apply(client_script)``)."""
    return os.environ.get(BATCH_ENV) == "1"


def no_batch_mode(job: JobTrait, client_script: str | None) -> None:
    """What a kind of job that cannot run its client says to ``apply(client_script=...)``."""
    if client_script is not None:
        raise JobError(
            f"{type(job).__name__} cannot run batch-mode scripts (apply(client_script=...)): "
            "run the script where it attaches (job.state()); SlurmJob and LocalJob can"
        )


def checked_meshes(meshes: Mapping[str, int], unit: str) -> dict[str, int]:
    """A job's meshes (``{"trainers": 2}``): names that are attributes of its state, and
    at least one host (``unit``) each."""
    for name, count in meshes.items():
        if not name.isidentifier():
            raise ValueError(f"a mesh name must be an identifier, not {name!r}")
        if type(count) is not int or count < 1:
            raise ValueError(f"mesh {name!r}: the number of {unit} must be >= 1, not {count!r}")
    return dict(meshes)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 (it holds the job secret), atomically;
    through a symbolic link (``monarch context``'s), to where it points."""
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(partial, path)


def job_loads(data: bytes) -> JobTrait:
    """The job ``dumps`` returned. Raises JobError for data that is not a saved job of
    this version."""
    try:
        loaded = pickle.loads(data)
    except Exception as exc:
        raise JobError(f"not a saved job ({type(exc).__name__}: {exc})") from exc
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[1], JobTrait)):
        raise JobError("not a saved job")
    if loaded[0] != FORMAT:
        raise JobError(f"a job saved in format {loaded[0]!r}; this version reads {FORMAT}")
    return loaded[1]


def job_load(filename: str | os.PathLike[str] = DEFAULT_JOB_PATH) -> JobTrait:
    """The job saved at ``filename`` (``state()`` saves it there by default)."""
    try:
        data = Path(filename).read_bytes()
    except OSError as exc:
        raise JobError(f"cannot read a saved job at {filename}: {exc.strerror}") from None
    return job_loads(data)


_attached_through: list[str] = []
"""The saved job file (a real path) this process's last ``state()`` went through."""


def attached_job_file() -> str | None:
    """The real path of the saved job this client attached through (``.monarch/<context>/
    state.pkl``), if any: its admin server records it, so that ``monarch query`` run in
    that folder finds this client's server for the active context."""
    return _attached_through[0] if _attached_through else None


def _load_cached(path: str) -> JobTrait | None:
    """The job saved at ``path``; None (saying why) if there is none or it is unusable."""
    if not os.path.exists(path):
        return None
    try:
        return job_load(path)
    except JobError as exc:
        print(f"Ignoring the cached job at {path}: {exc}", file=sys.stderr)
        return None


def _end_leftovers(job: JobTrait) -> None:
    """End what still runs of a saved job that is being replaced (a worker that survived
    its peers would hold the port the new one needs, or an allocation, forever)."""
    try:
        job._kill()
    except JobError as exc:
        print(f"Could not end what is left of the cached job: {exc}", file=sys.stderr)


_current: list[JobTrait] = []


def set_current_job(job: JobTrait) -> None:
    """Make ``job`` the one ``load_current_job`` and ``hosts_from_config`` use."""
    _current[:] = [job]


def current_job_set() -> bool:
    """Whether ``set_current_job`` was called."""
    return bool(_current)


def load_current_job(cached_path: str | None = DEFAULT_JOB_PATH) -> JobState:
    """The state of the current job (``set_current_job``), or of the one saved at
    ``cached_path``."""
    if _current:
        return _current[0].state(cached_path)
    if cached_path is None:
        raise JobError("no current job: call set_current_job(job) first")
    job = job_load(cached_path)
    return job.state(cached_path)
