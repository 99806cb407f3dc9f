"""PortForwarder: client ports forwarded to ranks of a mesh, with real sockets (locally,
and across two network-namespace hosts where the service listens on the far host's
loopback only)."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobkit import drop_hosts, make_hosts

from monarch.actor import ActorMesh, Point, ProcMesh, this_host, this_proc
from monarch.core.testing import wait_until
from monarch.job import PortForwarder

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def forward_one(forwarder: ActorMesh[PortForwarder], proc: ProcMesh, port: int) -> int:
    """Forward a fresh local port of this process to ``port`` of one proc; the local port."""
    local = free_port()
    forwarder.forward.call_one(proc, port, this_proc(), f"127.0.0.1:{local}").get(timeout=60)
    return local


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


class Service:
    """A TCP service on 127.0.0.1 whose connections ``handle`` serves, one thread each."""

    def __init__(self, handle: Callable[[socket.socket], None], port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port: int = self.sock.getsockname()[1]
        self.handle = handle
        self.errors: list[BaseException] = []

    def start(self) -> Service:
        self.sock.listen()
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            with conn:
                self.handle(conn)
        except BaseException as exc:  # noqa: BLE001 - the test reads them
            self.errors.append(exc)

    def close(self) -> None:
        self.sock.close()


def echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)


def digest_after_eof(conn: socket.socket) -> None:
    """Reads everything (after a pause that leaves the sender backpressured), then answers
    with its length and SHA-256."""
    received = hashlib.sha256()
    total = 0
    while data := conn.recv(65536):
        received.update(data)
        total += len(data)
    conn.sendall(struct.pack("!Q", total) + received.digest())


def answer(text: bytes) -> Callable[[socket.socket], None]:
    def serve(conn: socket.socket) -> None:
        conn.sendall(text)

    return serve


def read_all(conn: socket.socket) -> bytes:
    out = bytearray()
    while data := conn.recv(65536):
        out += data
    return bytes(out)


def send_then_end(conn: socket.socket, chunks: list[bytes]) -> None:
    for chunk in chunks:
        conn.sendall(chunk)
    conn.shutdown(socket.SHUT_WR)


def exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        sender = threading.Thread(target=send_then_end, args=(conn, [payload]))
        sender.start()
        got = read_all(conn)
        sender.join(60)
        return got


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=60)


@pytest.fixture
def forwarder() -> Iterator[ActorMesh[PortForwarder]]:
    fwd = this_proc().spawn(f"fwd{free_port()}", PortForwarder)
    yield fwd
    fwd.stop().get(timeout=60)


def test_one_forward_per_rank_several_owned_by_one_forwarder(
    procs: ProcMesh, forwarder: ActorMesh[PortForwarder]
) -> None:
    services = [Service(answer(b"rank %d" % rank)).start() for rank in range(2)]
    local = [free_port() for _ in range(2)]
    for rank in range(2):
        forwarder.forward.call_one(
            procs.slice(gpus=rank), services[rank].port, this_proc(), f"127.0.0.1:{local[rank]}"
        ).get(timeout=60)
    assert [exchange(local[rank], b"") for rank in range(2)] == [b"rank 0", b"rank 1"]
    # A whole mesh at once: the port and the address are functions of the point.
    clients = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        ports = [s.port for s in services]
        mine = [free_port() for _ in range(2)]
        forwarder.forward.call_one(
            procs,
            lambda point: ports[point["gpus"]],
            clients,
            lambda point: f"127.0.0.1:{mine[point['gpus']]}",
        ).get(timeout=60)
        assert [exchange(mine[rank], b"") for rank in range(2)] == [b"rank 0", b"rank 1"]
        forwarder.stop().get(timeout=60)
        assert all(refused(port) for port in (*local, *mine))  # stop closes every forward
    finally:
        clients.stop().get(timeout=60)


def test_it_waits_for_the_destination_to_be_up(
    procs: ProcMesh, forwarder: ActorMesh[PortForwarder]
) -> None:
    service = Service(echo)  # bound, not listening yet: a dial is refused
    local = forward_one(forwarder, procs.slice(gpus=0), service.port)
    with socket.create_connection(("127.0.0.1", local), timeout=60) as conn:
        conn.sendall(b"early bytes")
        service.start()  # up after the client connected
        conn.shutdown(socket.SHUT_WR)
        assert read_all(conn) == b"early bytes"


def test_data_stays_intact_under_backpressure(
    procs: ProcMesh, forwarder: ActorMesh[PortForwarder]
) -> None:
    service = Service(digest_after_eof).start()
    local = forward_one(forwarder, procs.slice(gpus=1), service.port)
    payload = os.urandom(24 * 1024 * 1024)
    got = exchange(local, payload)
    assert got == struct.pack("!Q", len(payload)) + hashlib.sha256(payload).digest()
    # and the other way: the client reads nothing until the service has written it all
    big = os.urandom(16 * 1024 * 1024)
    written = threading.Event()

    def write_all_then_say(conn: socket.socket) -> None:
        conn.sendall(big)
        written.set()

    service2 = Service(write_all_then_say).start()
    local2 = forward_one(forwarder, procs.slice(gpus=0), service2.port)
    with socket.create_connection(("127.0.0.1", local2), timeout=60) as conn:
        assert written.wait(60)
        assert read_all(conn) == big


def test_an_abrupt_disconnect_reaches_the_other_end(
    procs: ProcMesh, forwarder: ActorMesh[PortForwarder]
) -> None:
    seen: list[bytes | type[BaseException]] = []
    ended = threading.Event()

    def watch(conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                seen.append(data)
            seen.append(b"<clean end>")
        except ConnectionResetError:
            seen.append(ConnectionResetError)
        finally:
            ended.set()

    service = Service(watch).start()
    local = forward_one(forwarder, procs.slice(gpus=0), service.port)
    conn = socket.create_connection(("127.0.0.1", local), timeout=60)
    conn.sendall(b"hello")
    wait_until(lambda: b"hello" in seen, 60, "the service got the first bytes")
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()  # a reset, not an end of file
    assert ended.wait(60)
    assert seen[-1] is ConnectionResetError

    def reset_at_once(conn: socket.socket) -> None:
        conn.recv(5)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    service2 = Service(reset_at_once).start()
    local2 = forward_one(forwarder, procs.slice(gpus=1), service2.port)
    with socket.create_connection(("127.0.0.1", local2), timeout=60) as conn2:
        conn2.sendall(b"hello")
        with pytest.raises(ConnectionResetError):
            read_all(conn2)


def test_stop_ends_a_backpressured_connection(procs: ProcMesh) -> None:
    fwd = this_proc().spawn("fwd_stop", PortForwarder)
    flood = os.urandom(1024 * 1024)

    def firehose(conn: socket.socket) -> None:
        while True:
            conn.sendall(flood)

    service = Service(firehose).start()
    local = forward_one(fwd, procs.slice(gpus=0), service.port)
    with socket.create_connection(("127.0.0.1", local), timeout=60) as conn:
        first = conn.recv(1024)  # flowing, then nobody reads: the forward backs up
        assert first
        fwd.stop().get(timeout=60)
        assert refused(local)
        # what was in flight drains, then the connection ends (reset: it was cut short)
        with pytest.raises(ConnectionResetError):
            read_all(conn)


def test_meshes_of_different_shapes_are_refused(
    procs: ProcMesh, forwarder: ActorMesh[PortForwarder]
) -> None:
    with pytest.raises(Exception, match="same shape"):
        forwarder.forward.call_one(procs, 8000, this_proc(), "127.0.0.1:8001").get(timeout=60)
    with pytest.raises(Exception, match="from 1 to 65535"):
        forwarder.forward.call_one(procs.slice(gpus=0), 0, this_proc(), "127.0.0.1:8001").get(
            timeout=60
        )
    with pytest.raises(Exception, match="address:port"):
        forwarder.forward.call_one(procs.slice(gpus=0), 80, this_proc(), "8001").get(timeout=60)


def _listening(port: int) -> bool:
    return not refused(port)


def test_a_setup_failure_closes_what_it_had_opened(
    procs: ProcMesh, forwarder: ActorMesh[PortForwarder]
) -> None:
    clients = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        opened = free_port()

        def address(point: Point) -> str:
            if point["gpus"] == 0:
                return f"127.0.0.1:{opened}"
            deadline = time.monotonic() + 60  # rank 1 fails once rank 0 listens
            while not _listening(opened) and time.monotonic() < deadline:
                time.sleep(0.01)
            return "no port here"

        with pytest.raises(Exception, match="address:port"):
            forwarder.forward.call_one(procs, 9, clients, address).get(timeout=60)
        assert refused(opened)
    finally:
        clients.stop().get(timeout=60)


@pytest.fixture(scope="module")
def echo_forward(procs: ProcMesh) -> Iterator[int]:
    fwd = this_proc().spawn("fwd_echo", PortForwarder)
    service = Service(echo).start()
    local = forward_one(fwd, procs.slice(gpus=1), service.port)
    yield local
    fwd.stop().get(timeout=60)
    service.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.binary(min_size=1, max_size=200_000), max_size=12))
def test_bytes_in_any_chunks_arrive_intact_and_in_order(
    echo_forward: int, chunks: list[bytes]
) -> None:
    with socket.create_connection(("127.0.0.1", echo_forward), timeout=60) as conn:
        out = bytearray()
        sender = threading.Thread(target=send_then_end, args=(conn, chunks))
        sender.start()
        out += read_all(conn)
        sender.join(60)
    assert bytes(out) == b"".join(chunks)


# -- across two hosts: the client reaches a service on the far host's loopback ------------

SERVICE = """
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.sendall(os.readlink("/proc/self/ns/net").encode() + b"\\n")
    while d := c.recv(65536):
        c.sendall(d)
    c.close()
"""

CLIENT = """
import socket, sys
from monarch.actor import attach_to_workers, this_proc
from monarch.job import PortForwarder
worker, port = sys.argv[1], int(sys.argv[2])
hosts = attach_to_workers(workers=[worker], name="hosts")
procs = hosts.spawn_procs(per_host={"gpus": 1})
fwd = this_proc().spawn("fwd", PortForwarder)
s = socket.socket(); s.bind(("127.0.0.1", 0)); local = s.getsockname()[1]; s.close()
fwd.forward.call_one(procs.slice(hosts=0, gpus=0), port, this_proc(), f"127.0.0.1:{local}").get(60)
try:
    socket.create_connection(("10.0.0.2", port), timeout=5)
    print("direct: reached", flush=True)
except OSError:
    print("direct: unreachable", flush=True)
with socket.create_connection(("127.0.0.1", local), timeout=60) as c:
    payload = bytes(range(256)) * 40000
    c.sendall(payload); c.shutdown(socket.SHUT_WR)
    out = b""
    while d := c.recv(65536):
        out += d
net, _, rest = out.partition(b"\\n")
print("net:", net.decode(), flush=True)
print("intact:", rest == payload, flush=True)
fwd.stop().get(60)
procs.stop().get(60)
"""


LISTEN = ("--listen", "tcp://10.0.0.2:26600")


def in_host(host: str) -> list[str]:
    return ["ip", "netns", "exec", host]


@pytest.fixture
def two_hosts() -> Iterator[list[str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the two-host test needs root and iproute2 (network namespaces)")
    prefix = f"pf{os.getpid() % 100000}"
    try:
        yield make_hosts(2, prefix)
    finally:
        drop_hosts(prefix)


def test_a_client_reaches_a_service_on_another_hosts_loopback(two_hosts: list[str]) -> None:
    from monarch.core import SECRET_ENV

    env = {**os.environ, SECRET_ENV: os.urandom(32).hex()}
    service = subprocess.Popen(
        ["ip", "netns", "exec", two_hosts[1], sys.executable, "-c", SERVICE],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = subprocess.Popen(
        [*in_host(two_hosts[1]), sys.executable, "-m", "monarch.core", "worker", *LISTEN],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stdout is not None and worker.stdout is not None
        port = service.stdout.readline().strip()
        address = worker.stdout.readline().strip()
        assert address == "tcp://10.0.0.2:26600"
        done = subprocess.run(
            ["ip", "netns", "exec", two_hosts[0], sys.executable, "-c", CLIENT, address, port],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        far = subprocess.run(
            ["ip", "netns", "exec", two_hosts[1], "readlink", "/proc/self/ns/net"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        lines = done.stdout.splitlines()
        assert "direct: unreachable" in lines  # its loopback: only the forward reaches it
        assert f"net: {far}" in lines
        assert "intact: True" in lines
    finally:
        for proc in (worker, service):
            proc.kill()
            proc.communicate(timeout=30)
