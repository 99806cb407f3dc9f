"""Drop-in hosts and procs, as upstream's: meshes sent before their procs run, who may stop
what, how procs are started (bootstrap commands, CPU binding, another Python), the proc
table, module globals finalized when a proc stops, and the worker addresses upstream takes.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import (
    Actor,
    HostMesh,
    MeshFailure,
    ProcMesh,
    default_bootstrap_cmd,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)

NOT_OWNED = "ProcMesh is not owned; must be stopped by an owner"


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def environment(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def crash(self) -> None:
        os._exit(7)


class Supervisor(Actor):
    """Takes a proc mesh that may still be starting, spawns on it and watches it."""

    def __init__(self, procs: ProcMesh) -> None:
        self.procs = procs
        self.workers: Any = None
        self.reports: list[str] = []

    @endpoint
    def start(self) -> list[int]:
        self.workers = self.procs.spawn("workers", Worker)
        return sorted(self.workers.pid.call().get().values())

    @endpoint
    def crash_one(self) -> None:
        self.workers.slice(gpus=0).crash.broadcast()

    @endpoint
    def seen(self) -> list[str]:
        return self.reports

    @endpoint
    def stop_procs(self) -> str:
        try:
            self.procs.stop().get()
        except ValueError as error:
            return str(error)
        return "stopped"

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.reports.append(failure.report())
        return True


# -- meshes sent before their procs run ----------------------------------------------------------


def test_a_starting_proc_mesh_can_be_handed_to_a_controller() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})  # not awaited: still starting
    supervisor = get_or_spawn_controller("drop-in supervisor", Supervisor, procs).get(timeout=60)
    pids = supervisor.start.call_one().get(timeout=60)
    assert len(pids) == 2 and os.getpid() not in pids
    # The controller owns the actors it spawned there: their failures are its to handle.
    supervisor.crash_one.call_one().get(timeout=60)
    deadline = time.monotonic() + 60
    while not (reports := supervisor.seen.call_one().get(timeout=60)):
        assert time.monotonic() < deadline, "the failure did not reach __supervise__"
    assert "exited with non-zero code 7" in reports[0]
    # It did not spawn the procs: only their owner stops them.
    assert supervisor.stop_procs.call_one().get(timeout=60) == NOT_OWNED
    procs.stop().get(timeout=60)


class Spawner(Actor):
    @endpoint
    def spawn_on(self, procs: ProcMesh) -> int:
        return len(procs.spawn("inner", Worker).pid.call().get())


def test_a_starting_proc_mesh_travels_in_a_call() -> None:
    helper = this_host().spawn_procs(per_host={"x": 1}).spawn("spawner", Spawner)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    assert helper.spawn_on.call_one(procs).get(timeout=60) == 2
    procs.stop().get(timeout=60)


class AsyncWorker(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class User(Actor):
    @endpoint
    async def use(self, workers: Any) -> list[int]:
        return sorted((await workers.pid.call()).values())


class Maker(Actor):
    @endpoint
    async def make_and_pass(self, user: Any) -> list[int]:
        procs = this_host().spawn_procs(per_host={"g": 2})
        workers = procs.spawn("made", AsyncWorker)  # its procs are still starting
        return list(await user.use.call_one(workers))


def test_an_actor_mesh_on_starting_procs_travels_from_an_async_endpoint() -> None:
    procs = this_host().spawn_procs(per_host={"x": 2})
    user = procs.slice(x=0).spawn("user", User)
    maker = procs.slice(x=1).spawn("maker", Maker)
    assert len(set(maker.make_and_pass.call_one(user).get(timeout=60))) == 2
    procs.stop().get(timeout=60)


# -- who may stop what ----------------------------------------------------------------------------


def test_only_the_owned_proc_mesh_can_be_stopped() -> None:
    with pytest.raises(ValueError, match=NOT_OWNED):
        this_proc().stop().get(timeout=60)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with pytest.raises(ValueError, match=NOT_OWNED):
        procs.slice(gpus=0).stop().get(timeout=60)
    procs.stop().get(timeout=60)


def test_this_host_is_a_reference() -> None:
    host = this_host()
    assert host.is_fake_in_process is False
    with pytest.raises(RuntimeError, match="cannot stop `HostMesh` that is a reference"):
        host.stop().get(timeout=60)
    with pytest.raises(RuntimeError, match="cannot shut down `HostMesh` that is a reference"):
        host.shutdown().get(timeout=60)


class HostReader(Actor):
    @endpoint
    def host(self) -> tuple[str, bool, str]:
        host = this_host()
        return type(host).__name__, host.is_fake_in_process, type(this_proc().host_mesh).__name__


def test_host_mesh_of_a_proc() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    assert isinstance(procs.slice(gpus=1).host_mesh, HostMesh)
    with pytest.raises(NotImplementedError, match="non-singleton proc meshes"):
        procs.host_mesh
    reader = procs.slice(gpus=0).spawn("reader", HostReader)
    assert reader.host.call_one().get(timeout=60) == ("HostMesh", False, "HostMesh")
    procs.stop().get(timeout=60)


# -- how procs are started ------------------------------------------------------------------------


def test_default_bootstrap_cmd_is_upstreams() -> None:
    command = default_bootstrap_cmd()
    assert command.program == sys.executable
    assert command.args == ["-m", "monarch._src.actor.bootstrap_main"]
    assert command.env == {} and command.inherit_env is True
    changed = command.with_env({"FOO": "1", "BAR": None})
    assert changed.env == {"FOO": "1", "BAR": None} and command.env == {}
    text = repr(changed)  # upstream's env order is a hash map's: any
    assert text.startswith(
        f"BootstrapCommand(program={sys.executable!r}, "
        """args=["-m", "monarch._src.actor.bootstrap_main"], env={"""
    )
    assert text.endswith("}, inherit_env=True)")
    assert '"FOO": Some("1")' in text and '"BAR": None' in text


def test_bootstrap_command_sets_the_procs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DROPIN_REMOVED", "inherited")
    command = default_bootstrap_cmd().with_env({"DROPIN_SET": "1", "DROPIN_REMOVED": None})
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=command)
    workers = procs.spawn("env", Worker)
    assert workers.environment.call("DROPIN_SET").get(timeout=60).values() == ["1", "1"]
    assert workers.environment.call("DROPIN_REMOVED").get(timeout=60).values() == [None, None]
    procs.stop().get(timeout=60)


def test_bootstrap_command_per_point() -> None:
    def command(point: Any) -> Any:
        return default_bootstrap_cmd().with_env({"DROPIN_RANK": str(point.rank)})

    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=command)
    workers = procs.spawn("ranked", Worker)
    assert workers.environment.call("DROPIN_RANK").get(timeout=60).values() == ["0", "1"]
    procs.stop().get(timeout=60)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_proc_bind_pins_each_proc() -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    binding = [{"cpus": str(first)}, {"cpus": str(second)}]
    procs = this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=binding)
    cpus = procs.spawn("bound", Worker).cpus.call().get(timeout=60).values()
    assert cpus == [[first], [second]]
    procs.stop().get(timeout=60)
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(2\)"):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])


class Nester(Actor):
    @endpoint
    def spawn_nested(self) -> int:
        procs = this_host().spawn_procs(per_host={"n": 1})
        pid: int = procs.spawn("nested", Worker).pid.call_one().get()
        procs.stop().get()
        return pid


def test_with_python_executable_reaches_the_procs_own_this_host(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho run >> "{runs}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    procs = this_host().with_python_executable(str(python)).spawn_procs(per_host={"x": 1})
    nester = procs.spawn("nester", Nester)
    nester.spawn_nested.call_one().get(timeout=60)
    assert runs.read_text().split() == ["run", "run"]  # the proc, and the one it spawned
    procs.stop().get(timeout=60)


# -- the proc table -----------------------------------------------------------------------------

TABLE_2X3 = (
    "                           gpus               \n"
    "      │+----+----------+----------+----------+\n"
    "      │|    |        0 |        1 |        2 |\n"
    "      │+====+==========+==========+==========+\n"
    "hosts │|  0 | 0.gpu[0] | 0.gpu[1] | 0.gpu[2] |\n"
    "      │+----+----------+----------+----------+\n"
    "      │|  1 | 1.gpu[0] | 1.gpu[1] | 1.gpu[2] |\n"
    "      │+----+----------+----------+----------+"
)
TABLE_SLICE = (
    "         hosts         \n"
    "+----------+----------+\n"
    "|        0 |        1 |\n"
    "+==========+==========+\n"
    "| 0.gpu[1] | 1.gpu[1] |\n"
    "+----------+----------+"
)


def test_to_table_draws_upstreams_grid() -> None:
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 3})
    assert procs.to_table() == TABLE_2X3
    assert procs.slice(gpus=1).to_table() == TABLE_SLICE
    procs.stop().get(timeout=60)


# -- module globals at a clean stop ---------------------------------------------------------------

MARKER_MODULE = """
import os


class Marker:
    def __init__(self, path):
        self.path = path

    def __del__(self, _os=os):
        fd = _os.open(self.path, _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND)
        _os.write(fd, b"finalized\\n")
        _os.close(fd)


def hold(path):
    global MARK
    MARK = Marker(path)
"""


def _hold(module: str, marker: str) -> None:
    """Import ``module`` as a module of this proc and have it keep a Marker global."""
    spec = importlib.util.spec_from_file_location("dropin_marker", module)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules["dropin_marker"] = loaded
    spec.loader.exec_module(loaded)
    loaded.hold(marker)


class Holder(Actor):
    @endpoint
    def hold(self, module: str, marker: str) -> None:
        _hold(module, marker)


class AsyncHolder(Actor):
    @endpoint
    async def hold(self, module: str, marker: str) -> None:
        _hold(module, marker)


@pytest.mark.parametrize("cls", [Holder, AsyncHolder], ids=["sync", "async"])
def test_module_globals_are_finalized_when_a_proc_stops(tmp_path: Path, cls: type) -> None:
    module = tmp_path / "dropin_marker.py"
    module.write_text(MARKER_MODULE)
    marker = tmp_path / "marker"
    procs = this_host().spawn_procs(per_host={"x": 1})
    holder: Any = procs.spawn("holder", cls)
    holder.hold.call_one(str(module), str(marker)).get(timeout=60)
    procs.stop().get(timeout=60)
    deadline = time.monotonic() + 30
    while not marker.exists():  # written as the proc exits
        assert time.monotonic() < deadline, "the module global was not finalized"
        time.sleep(0.02)
    assert marker.read_text() == "finalized\n"


# -- worker addresses -----------------------------------------------------------------------------


def _secret_env() -> dict[str, str]:
    """The environment a worker needs to join this client (ours: the job's secret)."""
    try:
        from monarch.core import job_secret  # ours; upstream has no job secret
    except ImportError:
        return {}
    return {"MONARCH_JOB_SECRET": job_secret().hex()}


@pytest.fixture
def worker_at() -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(address: str, pass_fds: tuple[int, ...] = ()) -> None:
        code = (
            "from monarch.actor import run_worker_loop_forever; "
            f"run_worker_loop_forever(address={address!r}, ca='trust_all_connections')"
        )
        env = {**os.environ, **_secret_env()}
        started.append(subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=pass_fds))

    yield start
    for worker in started:
        worker.kill()
        worker.wait()


_SPAWN_THROUGH = """if True:
    import os, sys
    from monarch.actor import Actor, attach_to_workers, endpoint

    class Remote(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    hosts = attach_to_workers(workers=[sys.argv[1]], ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    print(procs.spawn("remote", Remote).pid.call_one().get(timeout=60), flush=True)
    procs.stop().get(timeout=60)
    os._exit(0)
"""


def _spawn_through(worker: str) -> int:
    """A client attaching to ``worker`` spawns an actor there: the pid it runs in. The
    client is a process of its own: attaching to a TCP worker makes a client listen on
    TCP, which would change this test process's runtime for the tests after it."""
    done = subprocess.run(
        [sys.executable, "-c", _SPAWN_THROUGH, worker],
        env={**os.environ, **_secret_env()},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_worker_on_an_ipc_address(tmp_path: Path, worker_at: Any) -> None:
    path = tmp_path / "worker.sock"
    worker_at(f"ipc://{path}")
    deadline = time.monotonic() + 60
    while not path.exists():  # listening
        assert time.monotonic() < deadline, "the worker did not listen"
        time.sleep(0.02)  # a poll, not a spin: the worker starting needs the CPU
    assert _spawn_through(f"ipc://{path}") > 0


def test_a_worker_on_an_inherited_socket(worker_at: Any) -> None:
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    worker_at(f"tcp://127.0.0.1:fd{listening.fileno()}", pass_fds=(listening.fileno(),))
    listening.close()  # the worker has its own copy; connections queue until it accepts
    assert _spawn_through(f"tcp://127.0.0.1:{port}") > 0


def test_a_worker_with_an_advertised_and_a_bind_address(worker_at: Any) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    alias = f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}"
    worker_at(alias)
    deadline = time.monotonic() + 60
    while True:  # listening
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the worker did not listen"
            time.sleep(0.02)
    assert _spawn_through(alias) > 0


def test_attach_after_the_client_started_is_refused() -> None:
    this_host()  # the client runs
    from monarch.actor import attach

    with pytest.raises(RuntimeError, match="call attach\\(addr\\) before the first"):
        attach("tcp://127.0.0.1:1")
