"""Drop-in ``attach_to_workers`` with workers still starting, as upstream's: a batch scheduler
launches the worker processes a moment before the client attaches, so the client tries each
address again until ``mesh_attach_config_timeout``, and fails closed naming the hosts it
never reached.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0. Each client is a process of its own: attaching to a TCP worker makes a
client listen on TCP, which would change this test process's runtime for the tests after it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ATTACH_FAILED = "attach failed: config push failed during attach"

# A worker launched but not started: it waits for the gate (the client has attached and
# asked for procs) before it imports Monarch and listens.
_GATED_WORKER = """if True:
    import os, sys, time
    address, gate = sys.argv[1:]
    while not os.path.exists(gate):
        time.sleep(0.02)
    from monarch.actor import run_worker_loop_forever
    run_worker_loop_forever(address=address, ca="trust_all_connections")
"""

_ATTACH_THEN_OPEN_THE_GATE = """if True:
    import os, sys
    from pathlib import Path
    from monarch.actor import Actor, attach_to_workers, endpoint

    class Remote(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    address, gate = sys.argv[1:]
    hosts = attach_to_workers(workers=[address], ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    Path(gate).touch()  # only now does the worker start
    print(procs.spawn("remote", Remote).pid.call_one().get(timeout=120), flush=True)
    procs.stop().get(timeout=60)
    os._exit(0)
"""

_ATTACH_TO_NOBODY = """if True:
    import os, sys
    from monarch.actor import attach_to_workers
    from monarch.config import configure

    configure(mesh_attach_config_timeout="2s")
    hosts = attach_to_workers(workers=[sys.argv[1]], ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    for what, future in (("hosts", hosts.initialized), ("procs", procs.initialized)):
        try:
            future.get(timeout=120)
            print(what, "ready")
        except RuntimeError as error:
            print(what, type(error).__name__, str(error).replace(chr(10), " "))
    sys.stdout.flush()
    os._exit(0)
"""


def _secret_env() -> dict[str, str]:
    """The environment a worker needs to join this client (ours: the job's secret)."""
    try:
        from monarch.core import job_secret  # ours; upstream has no job secret
    except ImportError:
        return {}
    return {"MONARCH_JOB_SECRET": job_secret().hex()}


def _client(script: str, *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, *argv],
        env={**os.environ, **_secret_env()},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def launch_worker(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Launch a worker that starts only once the gate it returns exists."""
    launched: list[subprocess.Popen[bytes]] = []

    def launch(address: str, pass_fds: tuple[int, ...] = ()) -> Path:
        gate = tmp_path / f"gate{len(launched)}"
        argv = [sys.executable, "-c", _GATED_WORKER, address, str(gate)]
        env = {**os.environ, **_secret_env()}
        launched.append(subprocess.Popen(argv, env=env, pass_fds=pass_fds))
        return gate

    yield launch
    for worker in launched:
        worker.kill()
        worker.wait()


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def _spawns_there(worker: str, gate: Path) -> None:
    assert int(_client(_ATTACH_THEN_OPEN_THE_GATE, worker, str(gate)).split()[-1]) > 0


def test_a_worker_still_starting_on_an_ipc_address(
    tmp_path: Path, launch_worker: Callable[..., Path]
) -> None:
    address = f"ipc://{tmp_path / 'worker.sock'}"  # not bound yet when the client attaches
    _spawns_there(address, launch_worker(address))


def test_a_worker_still_starting_on_a_tcp_port(launch_worker: Callable[..., Path]) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"  # refused until the worker listens
    _spawns_there(address, launch_worker(address))


def test_a_worker_still_starting_on_an_inherited_socket(
    launch_worker: Callable[..., Path],
) -> None:
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    gate = launch_worker(f"tcp://127.0.0.1:fd{listening.fileno()}", (listening.fileno(),))
    listening.close()  # the worker has its copy; connections wait until it accepts
    _spawns_there(f"tcp://127.0.0.1:{port}", gate)


def test_a_worker_still_starting_with_an_advertised_and_a_bind_address(
    launch_worker: Callable[..., Path],
) -> None:
    port = _free_port()
    alias = f"tcp://127.0.0.1:{port}@tcp://0.0.0.0:{port}"
    _spawns_there(alias, launch_worker(alias))


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_a_worker_that_never_starts_fails_the_attach_naming_it(tmp_path: Path, scheme: str) -> None:
    if scheme == "tcp":
        host = f"127.0.0.1:{_free_port()}"  # nothing listens there
        address = f"tcp://{host}"
    else:
        host = str(tmp_path / "nobody.sock")
        address = f"ipc://{host}"
    lines = _client(_ATTACH_TO_NOBODY, address).splitlines()
    assert len(lines) == 2, lines
    for what, line in zip(("hosts", "procs"), lines, strict=True):
        assert line.startswith(f"{what} RuntimeError {ATTACH_FAILED}"), line
        assert host in line, line
