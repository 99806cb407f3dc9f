"""Hosts on other machines: ``monarch worker``, attach_to_workers, failures and heartbeats.

Every worker and controller is a real process. A controller that attaches to workers must
listen on TCP, so controllers run as their own processes (``remote_controller.py``), which
also keeps this test process's runtime as it was. The network-namespace test puts the
controller and two workers on three "hosts" (h1..h3, 10.0.0.1..3 on a private bridge) and
cuts one off; it needs root and iproute2 and is skipped without them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path

import anyio
import pytest
from hostkit import (
    SECRET_ENV,
    NetnsUnavailable,
    children,
    gateway_argv,
    ip,
    network_namespaces,
    start_worker,
    worker_argv,
)

from monarch.core import Future, WorkerConfigError
from monarch.core._command import _cli
from monarch.core._host import _worker
from monarch.core._host._attach import _resolve, attach_to_workers
from monarch.core._host._environ import ROOT_ENV, decode_secret
from monarch.core._host._zygote_proc import TITLE as ZYGOTE_TITLE
from monarch.core._runtime._messages import TO_PROC, Envelope, StopProc, encode, encode_body
from monarch.core._runtime._netaddr import ip_host, split_alias
from monarch.core.testing import Child, alive, wait_until
from monarch.transport import open_connection

CONTROLLER = Path(__file__).with_name("remote_controller.py")
HEARTBEAT_TIMEOUT = 1.5  # what remote_controller.py configures


@pytest.fixture
def secret() -> str:
    return secrets.token_hex(32)


@pytest.fixture
def env(secret: str) -> dict[str, str]:
    """What the test's workers and controllers run with: jobs of their own, so not the
    root this process names for its own children once its runtime has started."""
    own = {k: v for k, v in os.environ.items() if k != ROOT_ENV}
    return {**own, SECRET_ENV: secret}


@pytest.fixture
def start() -> Iterator[Callable[..., Child]]:
    """Start a Child; all are killed when the test ends."""
    with children() as start:
        yield start


# -- the command ---------------------------------------------------------------------------


def test_worker_is_a_monarch_subcommand() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="monarch.commands")}
    assert found.get("worker") == "monarch.core._host._worker:register"
    args = _cli.build_parser().parse_args(["worker", "--listen", "tcp://127.0.0.1:0"])
    assert args.func is _worker._command
    assert args.secret_file is None


def test_worker_secret_comes_from_env_or_a_private_file(
    start: Callable[..., Child], tmp_path: Path, secret: str
) -> None:
    no_secret = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    done = subprocess.run(
        worker_argv("tcp://127.0.0.1:0"), env=no_secret, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "no job secret" in done.stderr and SECRET_ENV in done.stderr

    path = tmp_path / "secret"
    path.write_text(secret + "\n")
    path.chmod(0o644)
    done = subprocess.run(
        worker_argv("tcp://127.0.0.1:0", "--secret-file", str(path)),
        env=no_secret,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "mode 0644" in done.stderr and "chmod 600" in done.stderr
    assert secret not in done.stderr

    path.chmod(0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    child = start(worker_argv("tcp://127.0.0.1:0", "--secret-file", str(path)), no_secret)
    address = child.line(30)
    assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":0")
    assert secret not in " ".join(child.argv)
    child.popen.send_signal(signal.SIGTERM)
    assert child.wait(10) == 0


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda path: None, "does not exist"),
        (lambda path: path.mkdir(), "is a directory"),
        (lambda path: path.symlink_to(path.with_name("elsewhere")), "is a symbolic link"),
    ],
    ids=["missing", "directory", "symlink"],
)
def test_secret_file_errors_are_sentences(
    tmp_path: Path, make: Callable[[Path], object], says: str
) -> None:
    path = tmp_path / "secret"
    make(path)
    no_secret = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    done = subprocess.run(
        worker_argv("tcp://127.0.0.1:0", "--secret-file", str(path)),
        env=no_secret,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        done.stderr
        == f"monarch worker: secret file {str(path)!r} {says}" + (done.stderr.split(says, 1)[1])
    )
    assert "Errno" not in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize("short", ["", "00", "ab" * 15])
def test_a_secret_under_128_bits_is_refused_everywhere_it_is_read(
    short: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything shorter would let one captured handshake proof be searched offline."""
    requirement = r"at least 16 bytes \(128 bits"
    if short:  # an empty variable means: no secret (a worker refuses, a job makes one)
        with pytest.raises(ValueError, match=requirement):
            decode_secret(short, SECRET_ENV)  # what job_secret() reads an inherited one with
        monkeypatch.setenv(SECRET_ENV, short)
        with pytest.raises(WorkerConfigError, match=requirement):
            _worker.worker_secret()
    path = tmp_path / "secret"
    path.write_text(short + "\n")
    path.chmod(0o600)
    with pytest.raises(WorkerConfigError, match=requirement if short else "is empty"):
        _worker.read_secret_file(path)


def test_a_controller_given_a_short_secret_says_why_it_cannot_start() -> None:
    script = "from monarch.actor import this_host; this_host().spawn_procs()"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, SECRET_ENV: "00" * 8},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "at least 16 bytes (128 bits" in done.stderr, done.stderr[-2000:]


def test_the_worker_command_names_the_secret_requirement(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("00\n")
    path.chmod(0o600)
    no_secret = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    done = subprocess.run(
        worker_argv("tcp://127.0.0.1:0", "--secret-file", str(path)),
        env=no_secret,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "at least 16 bytes (128 bits" in done.stderr


def test_use_job_secret_takes_another_jobs_secret_before_the_runtime_starts() -> None:
    """A client re-attaching to a job another process started takes its secret; once
    this process has one of its own, another is refused."""
    script = """if True:
        import os
        from monarch.core import job_secret, use_job_secret
        first, second = os.urandom(32), os.urandom(32)
        use_job_secret(first)
        assert job_secret() == first and "MONARCH_JOB_SECRET" not in os.environ
        use_job_secret(first)  # the same one again is fine
        for bad, error in ((second, RuntimeError), (os.urandom(8), ValueError)):
            try:
                use_job_secret(bad)
            except error as exc:
                print(type(exc).__name__, exc)
    """
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("RuntimeError this process already has another job secret")
    assert lines[1] == "ValueError a job secret must be at least 16 bytes"


def test_a_secret_of_16_bytes_or_more_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = secrets.token_hex(16)
    monkeypatch.setenv(SECRET_ENV, secret)
    assert decode_secret(secret, SECRET_ENV) == _worker.worker_secret() == bytes.fromhex(secret)


def test_worker_stops_on_request_and_wildcard_is_advertised(
    start: Callable[..., Child], env: dict[str, str], secret: str
) -> None:
    child, address = start_worker(start, env, "tcp://0.0.0.0:0")
    assert not address.startswith("tcp://0.0.0.0:")  # a wildcard bind has a real address

    async def stop() -> None:
        conn = await open_connection(address, secret=bytes.fromhex(secret))
        try:
            await conn.send([encode(Envelope(TO_PROC, "", "test")), encode_body(StopProc("test"))])
        finally:
            await conn.aclose()

    anyio.run(stop)
    assert child.wait(10) == 0


def parent_of(pid: int) -> int:
    """The parent of ``pid`` (from /proc: the fields after the command's closing paren)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


# -- two workers on this machine -------------------------------------------------------------


def test_attach_spawn_call_and_survive_a_dead_host(
    start: Callable[..., Child], env: dict[str, str]
) -> None:
    w0, a0 = start_worker(start, env, "tcp://127.0.0.1:0")
    w1, a1 = start_worker(start, env, "tcp://127.0.0.1:0")
    argv = [sys.executable, str(CONTROLLER), "local", a0, str(w0.pid), a1, str(w1.pid)]
    controller = start(argv, env, stdin=True)

    first = controller.json(60)
    assert first["host_extent"] == {"hosts": 2}
    assert first["extent"] == {"hosts": 2, "gpus": 2}
    values = first["values"]
    assert len({v["pid"] for v in values}) == 4
    assert sorted((v["hosts"], v["gpus"]) for v in values) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    workers = [w0.pid, w1.pid]
    # Spawned by that host's agent: forked by its zygote (fork_procs), a child of the agent.
    # (each read in the call: the controller kills worker 0 as soon as it has printed them)
    parents = [(v["hosts"], v["ppid"], v["grandparent"]) for v in values]
    assert all(grand == workers[h] for h, _, grand in parents), (workers, parents)

    second = controller.json(60)  # worker 0 was SIGKILLed while a call to its procs ran
    pending, later = second["pending"], second["later"]
    assert pending["error"] == "SupervisionError" and pending["seconds"] < 10, pending
    assert later["error"] == "SupervisionError" and later["seconds"] < 10, later
    survivor = second["survivor"]["value"]
    assert [v["grandparent"] for v in survivor] == [w1.pid, w1.pid]
    dead = [v["pid"] for v in values if v["hosts"] == 0]
    wait_until(lambda: not any(map(alive, dead)), 10, f"procs {dead} of the killed worker exit")
    assert w0.wait(10) == -signal.SIGKILL
    assert w1.popen.poll() is None  # the other host goes on
    assert all(alive(v["pid"]) for v in survivor)

    controller.popen.kill()  # no proc outlives its job: the worker kills the orphans
    rest = [v["pid"] for v in survivor]
    wait_until(lambda: not any(map(alive, rest)), 10, f"procs {rest} of a dead controller exit")
    assert w1.popen.poll() is None  # and goes on serving


def test_the_controller_reaches_remote_procs_through_their_host_agents(
    start: Callable[..., Child], env: dict[str, str]
) -> None:
    # Spawns, stops and ready reports of procs a host agent watches go through that agent
    # (``_host._watching``): the controller is connected to the agents and, for casts, to
    # the heads of its cast tree (fan-out 2), not to each of the 6 procs (issue 34).
    w0, a0 = start_worker(start, env, "tcp://127.0.0.1:0")
    w1, a1 = start_worker(start, env, "tcp://127.0.0.1:0")
    controller = start([sys.executable, str(CONTROLLER), "connections", a0, a1], env)
    seen = controller.json(90)
    procs = set(seen["procs"])
    assert len(procs) == 6, seen
    assert {a0, a1} <= set(seen["outbound"]) and {a0, a1} <= set(seen["inbound"]), seen
    assert len(procs & set(seen["outbound"])) == 2, seen  # the cast tree's two heads
    assert len(procs & set(seen["inbound"])) == 2, seen  # their gathered replies
    assert sum(n for peer, n in seen["dialed"].items() if peer in procs) == 2, seen
    stopped = controller.json(90)["stop"]
    assert "error" not in stopped, stopped
    pids = seen["pids"]
    wait_until(lambda: not any(map(alive, pids)), 10, f"procs {pids} exit after stop()")
    assert w0.popen.poll() is None and w1.popen.poll() is None


def test_host_mesh_shutdown_stops_the_workers_and_their_procs(
    start: Callable[..., Child], env: dict[str, str]
) -> None:
    w0, a0 = start_worker(start, env, "tcp://127.0.0.1:0")
    w1, a1 = start_worker(start, env, "tcp://127.0.0.1:0")
    controller = start([sys.executable, str(CONTROLLER), "shutdown", a0, a1], env)
    result = controller.json(60)
    assert "error" not in result["shutdown"] and result["shutdown"]["value"] is None, result
    assert w0.wait(10) == 0 and w1.wait(10) == 0
    # Each worker forked its zygote as it started (fork_zygote): the procs' parent is a
    # child of the worker, shown as a zygote (not as one more `monarch worker`).
    assert sorted(grandparent for grandparent, _ in result["parents"]) == sorted([w0.pid, w1.pid])
    assert all(cmdline.startswith(ZYGOTE_TITLE) for _, cmdline in result["parents"])
    pids = result["pids"]
    wait_until(lambda: not any(map(alive, pids)), 10, f"procs {pids} exit with their workers")


def test_a_proc_whose_loop_is_busy_past_the_heartbeat_timeout_is_not_declared_dead(
    start: Callable[..., Child], env: dict[str, str]
) -> None:
    """An endpoint computing (or importing torch) for seconds keeps the GIL most of the
    time; the heartbeats go on from a thread of their own, so the peers wait for its answer."""
    _, address = start_worker(start, env, "tcp://127.0.0.1:0")
    seconds = 3 * HEARTBEAT_TIMEOUT
    controller = start([sys.executable, str(CONTROLLER), "busy", address, str(seconds)], env)
    assert "value" in controller.json(60)["warm"]
    busy = controller.json(90)["busy"]
    assert busy.get("value", 0) > 0, busy
    assert busy["seconds"] >= seconds


@pytest.mark.parametrize("when", ["during", "after"])
def test_stop_returns_when_the_procs_host_agent_froze_past_the_heartbeat(
    start: Callable[..., Child], env: dict[str, str], when: str
) -> None:
    """A worker frozen (SIGSTOP) until the controller declares it lost: ``stop()`` of its
    procs, called while it is frozen or after it resumed, returns (it cannot confirm their
    end from here, and says so) instead of raising TimeoutError, and the procs are gone
    once the worker runs again (it kills the procs of a controller it lost)."""
    worker, address = start_worker(start, env, "tcp://127.0.0.1:0")
    controller = start(
        [sys.executable, str(CONTROLLER), "frozen", address, str(worker.pid), when], env
    )
    result = controller.json(120)
    assert result["lost"] or when == "during"
    assert "error" not in result["stop"] and result["stop"]["value"] is None, result
    if when == "during":  # resumed, the worker may have reported their exits meanwhile
        assert "not confirmed stopped" in controller.said()
    pids = result["pids"]
    wait_until(lambda: not any(map(alive, pids)), 30, f"procs {pids} gone")


def test_wrong_secret_fails_fast(start: Callable[..., Child], env: dict[str, str]) -> None:
    worker, address = start_worker(
        start, {**env, SECRET_ENV: secrets.token_hex(32)}, "tcp://127.0.0.1:0"
    )
    controller = start([sys.executable, str(CONTROLLER), "wrong-secret", address], env)
    result = controller.json(60)["initialized"]
    assert result["error"] == "SupervisionError", result
    assert "secret" in result["message"]
    assert result["seconds"] < 10
    assert worker.popen.poll() is None  # a bad client does not hurt the worker


def test_enable_transport(env: dict[str, str]) -> None:
    script = """if True:
        import json
        from monarch.actor import this_host
        from monarch.core._host._attach import enable_transport
        from monarch.core import current_runtime
        enable_transport("tcp")
        this_host()
        address = current_runtime().address
        enable_transport("tcp")  # the same again: fine
        try:
            enable_transport("ipc")
            error = None
        except RuntimeError as exc:
            error = str(exc)
        print(json.dumps({"address": address, "error": error}))
    """
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["address"].startswith("tcp://")
    assert not result["address"].startswith("tcp://0.0.0.0:")
    assert "before the first use" in result["error"]


# -- three hosts in network namespaces --------------------------------------------------------


@pytest.fixture
def netns_hosts() -> Iterator[list[str]]:
    """Namespaces h1..h3 at 10.0.0.1..3/24 on a bridge of their own (as shared/infra/netns)."""
    try:
        with network_namespaces(3, f"mrh{os.getpid() % 100000}") as hosts:
            yield hosts
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))


def test_hosts_in_network_namespaces_and_a_partition(
    netns_hosts: list[str], start: Callable[..., Child], env: dict[str, str]
) -> None:
    h1, h2, h3 = netns_hosts
    _, a2 = start_worker(start, env, "tcp://10.0.0.2:0", netns=h2)
    _, a3 = start_worker(start, env, "tcp://10.0.0.3:0", netns=h3)
    assert a2.startswith("tcp://10.0.0.2:") and a3.startswith("tcp://10.0.0.3:")
    argv = ["ip", "netns", "exec", h1, sys.executable, str(CONTROLLER), "netns", a2, a3]
    controller = start(argv, env, stdin=True)

    first = controller.json(60)
    assert first["values"] == ["10.0.0.2", "10.0.0.2", "10.0.0.3", "10.0.0.3"]

    ip("-n", h3, "link", "set", "eth0", "down")  # h3 falls silent: no FIN, no RST
    controller.send_line("cut")
    second = controller.json(30)
    cut = second["cut"]
    assert cut["error"] == "SupervisionError", cut
    assert "heartbeat" in cut["message"] and "10.0.0.3" in cut["message"]
    assert cut["seconds"] <= HEARTBEAT_TIMEOUT + 2.5, cut
    assert [v["host"] for v in second["survivor"]["value"]] == ["10.0.0.2", "10.0.0.2"]


def test_procs_on_other_hosts_reach_the_root_of_a_client_that_attached_late(
    netns_hosts: list[str], start: Callable[..., Child], env: dict[str, str]
) -> None:
    """A client whose runtime started on a local socket, then attached to a worker: the
    worker's procs reach it at its network address (get_or_spawn_controller goes there)."""
    h1, h2, _ = netns_hosts
    _, a2 = start_worker(start, env, "tcp://10.0.0.2:0", netns=h2)
    argv = ["ip", "netns", "exec", h1, sys.executable, str(CONTROLLER), "root-far", a2]
    asked = start(argv, env).json(90)["asked"]
    assert asked.get("value") == [1, 2], asked  # one counter, in the root, for both


def test_a_worker_flooded_from_another_host_still_serves_its_job(
    netns_hosts: list[str], start: Callable[..., Child], env: dict[str, str]
) -> None:
    """h3, without the secret, holds 300 silent connections open to h2's worker: the
    controller on h1 still attaches, spawns and calls there, and the worker closes every
    one of the flood's connections (its hello deadline)."""
    h1, h2, h3 = netns_hosts
    _, a2 = start_worker(start, env, "tcp://10.0.0.2:0", netns=h2)
    flood = ["ip", "netns", "exec", h3, sys.executable, str(CONTROLLER), "flood", a2, "300"]
    flooder = start(flood, env, stdin=True)
    assert flooder.json(60) == {"flooding": 300}
    argv = ["ip", "netns", "exec", h1, sys.executable, str(CONTROLLER), "spawn", a2]
    spawned = start(argv, env).json(120)["spawned"]
    assert spawned.get("value") == ["10.0.0.2", "10.0.0.2"], spawned

    def all_closed() -> bool:
        flooder.send_line("count")
        return bool(flooder.json(30)["closed"] == 300)

    # each count is a line to the flooder and its answer; it ends when the test does
    wait_until(all_closed, 60, "the worker closed the flood's 300 connections")


def test_a_controller_outside_the_network_attaches_through_a_gateway(
    netns_hosts: list[str], start: Callable[..., Child], env: dict[str, str]
) -> None:
    """h1 (the controller) and h3 (a worker) cannot reach each other; both reach h2, where
    ``monarch gateway`` runs. Everything between them goes through it, faults included."""
    h1, h2, h3 = netns_hosts
    for host, other in ((h1, "10.0.0.3"), (h3, "10.0.0.1")):
        rules = (["OUTPUT", "-d", other, "-j", "REJECT"], ["INPUT", "-s", other, "-j", "DROP"])
        for rule in rules:
            argv = ["ip", "netns", "exec", host, "iptables", "-A", *rule]
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"iptables does not work in a network namespace here: {done.stderr}")
    gateway = start(["ip", "netns", "exec", h2, *gateway_argv("tcp://0.0.0.0:0")], env)
    via = gateway.line(30)
    assert via.startswith("gateway://10.0.0.2:"), via
    _, a3 = start_worker(start, env, "tcp://10.0.0.3:0", netns=h3)
    port = a3.rpartition(":")[2]
    probe = f"</dev/tcp/10.0.0.3/{port}"
    blocked = subprocess.run(["ip", "netns", "exec", h1, "bash", "-c", probe])
    assert blocked.returncode != 0  # the controller's host cannot reach the worker's

    argv = ["ip", "netns", "exec", h1, sys.executable, str(CONTROLLER), "gateway", via, a3]
    controller = start(argv, env, stdin=True)
    first = controller.json(90)
    assert first["controller"].startswith("gateway://") and first["controller"].endswith(
        via.removeprefix("gateway://")
    )
    assert first["hosts"] == ["10.0.0.3", "10.0.0.3"]
    assert all(address.startswith("tcp://10.0.0.3:") for address in first["procs"])

    os.kill(first["pids"][0], signal.SIGKILL)  # its death reaches the controller through h2
    controller.send_line("killed")
    second = controller.json(60)
    assert second["killed"]["error"] == "SupervisionError", second
    assert second["survivor"]["value"] == "10.0.0.3", second


def test_the_gateway_command_needs_the_secret_and_a_listen_address() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="monarch.commands")}
    assert found.get("gateway") == "monarch.core._host._gateway:register"
    no_secret = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    argv = gateway_argv("tcp://127.0.0.1:0")
    done = subprocess.run(argv, env=no_secret, capture_output=True, text=True)
    assert done.returncode == 2 and "no job secret" in done.stderr
    env = {**os.environ, SECRET_ENV: secrets.token_hex(32)}
    done = subprocess.run(gateway_argv("unix:///tmp/x"), env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "tcp://host:port" in done.stderr


def test_attach_refuses_a_gateway_address_with_a_route() -> None:
    from monarch.core._host._attach import _gateway_address

    with pytest.raises(ValueError, match="gateway://HOST:PORT"):
        _gateway_address("gateway://abc@10.0.0.2:7")
    assert _gateway_address("gateway://10.0.0.2:7") == "gateway://10.0.0.2:7"


# -- TLS between machines ------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA with certificates for a worker and a controller, and a stranger's certificate."""
    trustme = pytest.importorskip("trustme")
    ca, stranger = trustme.CA(), trustme.CA()
    files = {
        "ca": ca.cert_pem,
        "worker": ca.issue_cert("worker.example").private_key_and_cert_chain_pem,
        "controller": ca.issue_cert("controller.example").private_key_and_cert_chain_pem,
        "stranger": stranger.issue_cert("stranger.example").private_key_and_cert_chain_pem,
    }
    paths = {}
    for name, blob in files.items():
        paths[name] = tmp_path / f"{name}.pem"
        blob.write_to_path(str(paths[name]))
        paths[name].chmod(0o600)
    return paths


def tls_worker(
    start: Callable[..., Child], env: dict[str, str], ca: str, key: str | None, netns: str = ""
) -> str:
    listen = "tls://10.0.0.2:0" if netns else "tls://127.0.0.1:0"
    extra = ["--ca", ca, *(["--private-key", key] if key else [])]
    prefix = ["ip", "netns", "exec", netns] if netns else []
    worker = start([*prefix, *worker_argv(listen, *extra)], env)
    address = worker.line(30)
    assert address.startswith("tls://"), address
    return address


def test_workers_over_tls_with_a_ca_of_ones_own(
    start: Callable[..., Child], env: dict[str, str], pki: dict[str, Path]
) -> None:
    address = tls_worker(start, env, str(pki["ca"]), str(pki["worker"]))
    argv = [sys.executable, str(CONTROLLER), "tls", str(pki["ca"]), str(pki["controller"])]
    result = start([*argv, address], env).json(60)
    assert result["controller"].startswith("tls://"), result
    assert all(a.startswith("tls://") for a in result["procs"]), result  # procs too


def test_a_controller_the_workers_ca_did_not_sign_is_refused(
    start: Callable[..., Child], env: dict[str, str], pki: dict[str, Path]
) -> None:
    address = tls_worker(start, env, str(pki["ca"]), str(pki["worker"]))
    argv = [sys.executable, str(CONTROLLER), "tls", str(pki["ca"]), str(pki["stranger"])]
    result = start([*argv, address], env).json(60)["initialized"]
    assert result["error"] == "SupervisionError", result
    assert result["seconds"] < 30


def test_trust_all_connections_encrypts_with_throwaway_certificates(
    start: Callable[..., Child], env: dict[str, str]
) -> None:
    pytest.importorskip("cryptography")
    address = tls_worker(start, env, "trust_all_connections", None)
    argv = [sys.executable, str(CONTROLLER), "tls", "trust_all_connections", "-", address]
    result = start(argv, env).json(60)
    assert all(a.startswith("tls://") for a in [result["controller"], *result["procs"]]), result


def test_tls_arguments_are_checked(pki: dict[str, Path]) -> None:
    no_ca = subprocess.run(
        worker_argv("tls://127.0.0.1:0"), capture_output=True, text=True, timeout=60
    )
    assert no_ca.returncode == 2 and "tls:// addresses need ca=" in no_ca.stderr
    with pytest.raises(ValueError, match="are for tls:// addresses"):
        _worker.secure(ca=pki["ca"], private_key=pki["worker"], addresses=["tcp://h:1"])
    with pytest.raises(ValueError, match="needs private_key="):
        _worker.secure(ca=pki["ca"], private_key=None, addresses=["tls://h:1"])
    with pytest.raises(ValueError, match="private key and its certificate"):
        _worker.secure(ca=pki["ca"], private_key=pki["ca"], addresses=["tls://h:1"])


def test_a_local_job_over_tls_makes_its_own_ca(env: dict[str, str]) -> None:
    pytest.importorskip("cryptography")
    script = """if True:
        import json, os
        from monarch.actor import Actor, endpoint, enable_transport, this_host
        from monarch.core import current_runtime
        enable_transport("tls")
        class Where(Actor):
            @endpoint
            def where(self):
                env = [k for k in os.environ if k.startswith("MONARCH_TLS")]
                return current_runtime().address, env
        procs = this_host().spawn_procs(per_host={"gpus": 2})
        seen = procs.spawn("where", Where).where.call().get(timeout=60).values()
        print(json.dumps({"controller": current_runtime().address, "procs": seen}))
        procs.stop().get(timeout=60)
    """
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["controller"].startswith("tls://")
    assert result["procs"] == [[a, []] for a, _ in result["procs"]]  # no key left in env
    assert all(a.startswith("tls://") for a, _ in result["procs"])


def test_hosts_in_network_namespaces_over_tls(
    netns_hosts: list[str], start: Callable[..., Child], env: dict[str, str], pki: dict[str, Path]
) -> None:
    h1, h2, _ = netns_hosts
    address = tls_worker(start, env, str(pki["ca"]), str(pki["worker"]), netns=h2)
    argv = [sys.executable, str(CONTROLLER), "tls", str(pki["ca"]), str(pki["controller"])]
    result = start(["ip", "netns", "exec", h1, *argv, address], env).json(60)
    assert result["hosts"] == ["10.0.0.2", "10.0.0.2"], result
    assert result["controller"].startswith("tls://10.0.0.1:"), result


# -- addresses and arguments ------------------------------------------------------------------


def test_listen_address_forms() -> None:
    assert split_alias("tcp://10.0.0.2:7") == ("tcp://10.0.0.2:7", "tcp://10.0.0.2:7")
    assert split_alias("tcp://node1:7@tcp://0.0.0.0:7") == ("tcp://node1:7", "tcp://0.0.0.0:7")
    assert split_alias("service<x1>@tcp://node1:7") == ("tcp://node1:7", "tcp://node1:7")
    assert split_alias("unix://@abc") == ("unix://@abc", "unix://@abc")
    with pytest.raises(ValueError, match="not an address"):
        split_alias("tcp://a:1@tcp://b:2@tcp://c:3")


def test_the_host_of_an_address_over_ip() -> None:
    assert ip_host("tcp://10.0.0.2:7") == "10.0.0.2"
    assert ip_host("tls://[fe80::1]:7") == "fe80::1"
    assert ip_host("ibverbs://node1:7") == "node1"  # TCP underneath
    assert ip_host("tcp://0.0.0.0:7") == "0.0.0.0"  # the caller says what a wildcard means
    assert ip_host("unix://@abc") is None
    assert ip_host("tcp://") is None


def test_attach_refuses_what_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="job secret"):
        attach_to_workers(workers=["tcp://127.0.0.1:1"], ca=b"-----BEGIN CERTIFICATE-----")
    with pytest.raises(ValueError, match="tls:// addresses need ca="):
        attach_to_workers(workers=["tls://127.0.0.1:1"])
    with pytest.raises(ValueError, match="all tcp:// or all tls://"):
        attach_to_workers(
            workers=["tcp://127.0.0.1:1", "tls://127.0.0.1:2"], ca="trust_all_connections"
        )
    with pytest.raises(ValueError, match="listen pattern"):
        attach_to_workers(workers=["tcp://0.0.0.0:22222"])
    with pytest.raises(TypeError, match="sequence"):
        attach_to_workers(workers="tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="at least one"):
        attach_to_workers(workers=[])
    assert _resolve(Future._of("tcp://127.0.0.1:1")) == "tcp://127.0.0.1:1"
