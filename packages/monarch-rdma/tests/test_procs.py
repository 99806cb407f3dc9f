"""Buffers owned by actors of real procs, read and written by the client and by other
actors, over both planes without verbs: shared memory (the default within a host) and
TCP (``read_peer_buffers=False`` makes peers of one host use it too)."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.config import configured
from monarch.core.testing import wait_until
from monarch.rdma import (
    RDMAAction,
    RDMABuffer,
    RDMABufferDropped,
    RDMATimeoutError,
)
from monarch.rdma._process import local_process
from monarch.rdma._transfer import plane

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")

MIB = 1024 * 1024


def pattern(size: int, seed: int) -> bytes:
    """Bytes that differ at every offset and between seeds."""
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * 2048  # 64 KiB
    whole = block * (size // len(block) + 1)
    head = bytes(a ^ (i & 0xFF) for i, a in enumerate(whole[: min(4096, size)]))
    return head + whole[4096:size]


class Owner(Actor):
    """Owns buffers (by name) and uses other actors' buffers."""

    def __init__(self) -> None:
        self.data: dict[str, bytearray] = {}
        self.buffers: dict[str, RDMABuffer] = {}

    @endpoint
    def make(self, name: str, size: int, seed: int) -> RDMABuffer:
        self.data[name] = bytearray(pattern(size, seed))
        self.buffers[name] = RDMABuffer(self.data[name])
        return self.buffers[name]

    @endpoint
    def digest(self, name: str) -> str:
        return hashlib.sha256(self.data[name]).hexdigest()

    @endpoint
    def drop(self, name: str) -> None:
        self.buffers[name].drop().get()

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def connections(self) -> int:
        """The TCP plane's connections this proc's data server serves now."""
        return sum(t.name == "monarch-rdma-tcp-conn" for t in threading.enumerate())

    @endpoint
    def copy_from(self, buf: RDMABuffer) -> str:
        """Read another actor's buffer; the digest of what came."""
        out = bytearray(buf.size())
        buf.read_into(out).get()
        return hashlib.sha256(out).hexdigest()

    @endpoint
    def write_to(self, buf: RDMABuffer, size: int, seed: int) -> str:
        buf.write_from(pattern(size, seed)).get()
        return plane(buf._handle)

    @endpoint
    def add(self, buf: RDMABuffer, times: int) -> None:
        old = bytearray(8)
        for _ in range(times):
            RDMAAction().fetch_add(buf, old, 1).submit().get()

    @endpoint
    def try_read(self, buf: RDMABuffer) -> str:
        try:
            buf.read_into(bytearray(buf.size())).get()
        except Exception as error:  # noqa: BLE001 - the test looks at which
            return type(error).__name__
        return "ok"


class AsyncPeer(Actor):
    """An async actor: buffers made and awaited on the proc's event loop."""

    def __init__(self) -> None:
        self.data = bytearray(pattern(3 * MIB, 7))
        self.buf = RDMABuffer(self.data)

    @endpoint
    async def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    async def fetch(self, buf: RDMABuffer) -> str:
        out = bytearray(buf.size())
        await buf.read_into(out)
        await buf.write_from(out[::-1])
        return hashlib.sha256(out).hexdigest()

    @endpoint
    async def fresh(self, size: int) -> RDMABuffer:
        return RDMABuffer(bytearray(pattern(size, 8)))  # made on the loop itself


def sha(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module", params=["memory", "tcp"])
def mesh(request: pytest.FixtureRequest) -> Iterator[tuple[str, ProcMesh, Any]]:
    way = str(request.param)
    with configured(read_peer_buffers=way == "memory"):
        procs = this_host().spawn_procs(per_host={"procs": 2})
        owners = procs.spawn("owners", Owner)
        yield way, procs, owners
        procs.stop().get(timeout=60)


@pytest.mark.parametrize("size", [1, 3 * MIB + 5, 9 * MIB + 1])
def test_the_client_reads_and_writes_an_actors_buffer(
    mesh: tuple[str, ProcMesh, Any], size: int
) -> None:
    way, _, owners = mesh
    owner = owners.slice(procs=0)
    buf = owner.make.call_one(f"rw{size}", size, 1).get(timeout=60)
    assert plane(buf._handle) == way
    assert buf.size() == size
    out = bytearray(size)
    buf.read_into(out).get(timeout=60)
    assert out == pattern(size, 1)
    new = pattern(size, 2)
    buf.write_from(new).get(timeout=60)
    assert owner.digest.call_one(f"rw{size}").get(timeout=60) == sha(new)
    buf.drop().get(timeout=60)


def test_idle_tcp_streams_are_closed_and_opened_again_when_needed(
    mesh: tuple[str, ProcMesh, Any],
) -> None:
    """The client's streams to a data server stay open between transfers, close once
    unused for a while (the server's threads for them end), and a later transfer opens new
    ones."""
    way, _, owners = mesh
    if way != "tcp":
        pytest.skip("streams are the TCP plane's")
    owner = owners.slice(procs=0)
    buf = owner.make.call_one("idle", MIB, 3).get(timeout=60)
    out = bytearray(MIB)
    buf.read_into(out).get(timeout=60)
    process = local_process()
    assert process.close_idle_streams(3600) >= 1  # used just now: kept
    served = owner.connections.call_one().get(timeout=60)
    assert served >= 1
    assert process.close_idle_streams(0) == 0  # every one unused since before now
    wait_until(
        lambda: owner.connections.call_one().get(timeout=60) < served,
        60,
        "the owner's data server to end the threads of the closed streams",
    )
    again = bytearray(MIB)
    buf.read_into(again).get(timeout=60)
    assert again == pattern(MIB, 3)
    assert process.close_idle_streams(3600) >= 1
    buf.drop().get(timeout=60)


def test_actors_read_and_write_each_others_buffers(mesh: tuple[str, ProcMesh, Any]) -> None:
    way, _, owners = mesh
    size = 5 * MIB + 17
    buf = owners.slice(procs=0).make.call_one("peer", size, 3).get(timeout=60)
    other = owners.slice(procs=1)
    assert other.copy_from.call_one(buf).get(timeout=60) == sha(pattern(size, 3))
    assert other.write_to.call_one(buf, size - 1, 4).get(timeout=60) == way
    expected = pattern(size - 1, 4) + pattern(size, 3)[-1:]
    assert owners.slice(procs=0).digest.call_one("peer").get(timeout=60) == sha(expected)
    buf.drop().get(timeout=60)


def test_a_drop_by_anyone_fails_later_reads(mesh: tuple[str, ProcMesh, Any]) -> None:
    _, _, owners = mesh
    owner, other = owners.slice(procs=0), owners.slice(procs=1)
    buf = owner.make.call_one("dropped", 1024, 5).get(timeout=60)
    buf.drop().get(timeout=60)  # by the client
    assert other.try_read.call_one(buf).get(timeout=60) == "RDMABufferDropped"
    with pytest.raises(RDMABufferDropped):
        buf.write_from(b"x").get(timeout=60)
    buf2 = owner.make.call_one("dropped2", 1024, 5).get(timeout=60)
    owner.drop.call_one("dropped2").get(timeout=60)  # by the owner
    with pytest.raises(RDMABufferDropped):
        buf2.read_into(bytearray(1024)).get(timeout=60)


def test_atomics_from_several_processes_add_up(mesh: tuple[str, ProcMesh, Any]) -> None:
    _, _, owners = mesh
    counter = owners.slice(procs=0).make.call_one("counter", 8, 0).get(timeout=60)
    zero = bytearray(8)
    counter.write_from(zero).get(timeout=60)
    owners.add.call(counter, 25).get(timeout=120)  # both actors at once
    old = bytearray(8)
    RDMAAction().fetch_add(counter, old, 0).submit().get(timeout=60)
    assert int.from_bytes(old, "little") == 50
    counter.drop().get(timeout=60)


def test_an_action_reads_from_several_owners(mesh: tuple[str, ProcMesh, Any]) -> None:
    _, _, owners = mesh
    size = 2 * MIB
    bufs = [
        owners.slice(procs=p).make.call_one(f"act{p}{i}", size, 10 * p + i).get(timeout=60)
        for p in (0, 1)
        for i in (0, 1)
    ]
    out = bytearray(4 * size)
    view = memoryview(out)
    action = RDMAAction()
    for i, buf in enumerate(bufs):
        action.read_remote(view[i * size : (i + 1) * size], buf)
    action.submit().get(timeout=60)
    expected = b"".join(pattern(size, 10 * p + i) for p in (0, 1) for i in (0, 1))
    assert out == expected
    for buf in bufs:
        buf.drop().get(timeout=60)


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


def test_a_frozen_owner_times_out_not_hangs(mesh: tuple[str, ProcMesh, Any]) -> None:
    """Over TCP a write and a read need the owner (its data server takes or sends the
    bytes): a stopped owner ends them at the timeout. Within a host neither does: a read
    copies out of its memory, a write into it under the buffer's write gate, so both
    complete while the owner is stopped, and the write's bytes are there once it runs."""
    way, _, owners = mesh
    owner = owners.slice(procs=1)
    buf = owner.make.call_one("frozen", 4096, 6).get(timeout=60)
    pid = owner.pid.call_one().get(timeout=60)
    os.kill(pid, signal.SIGSTOP)
    try:
        # A signal is delivered when the process next runs: until it is seen stopped, it
        # may still serve the request (seen under load).
        deadline = time.monotonic() + 30
        while not _stopped(pid):
            assert time.monotonic() < deadline, "the owner never stopped"
            time.sleep(0.01)
        if way == "tcp":
            with pytest.raises(RDMATimeoutError):
                buf.write_from(bytearray(4096), timeout=1).get(timeout=60)
            with pytest.raises(RDMATimeoutError):
                buf.read_into(bytearray(4096), timeout=1).get(timeout=60)
        else:
            buf.write_from(pattern(4096, 9), timeout=1).get(timeout=60)
            out = bytearray(4096)
            buf.read_into(out, timeout=1).get(timeout=60)
            assert out == pattern(4096, 9)
            assert _stopped(pid)  # nothing of it needed the owner to run
    finally:
        os.kill(pid, signal.SIGCONT)
    out = bytearray(4096)
    buf.read_into(out).get(timeout=60)  # it serves again
    if way == "memory":
        assert owner.digest.call_one("frozen").get(timeout=60) == sha(pattern(4096, 9))


def test_async_actors_make_and_await_buffers(mesh: tuple[str, ProcMesh, Any]) -> None:
    _, procs, owners = mesh
    peers = procs.spawn("async_peers", AsyncPeer)
    mine = peers.slice(procs=1).handle.call_one().get(timeout=60)
    theirs = owners.slice(procs=0).make.call_one("for_async", 2 * MIB + 1, 9).get(timeout=60)
    assert peers.slice(procs=1).fetch.call_one(theirs).get(timeout=60) == sha(
        pattern(2 * MIB + 1, 9)
    )
    assert owners.slice(procs=0).digest.call_one("for_async").get(timeout=60) == sha(
        pattern(2 * MIB + 1, 9)[::-1]
    )
    out = bytearray(mine.size())
    mine.read_into(out).get(timeout=60)
    assert out == pattern(3 * MIB, 7)
    fresh = peers.slice(procs=0).fresh.call_one(4096).get(timeout=60)
    fresh.read_into(out).get(timeout=60)
    assert out[:4096] == pattern(4096, 8)
    theirs.drop().get(timeout=60)
