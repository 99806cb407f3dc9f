"""The TCP plane under a machine on the path: a real relay between a real data server and
its client forwards the handshake untouched, then changes one byte of what follows (a
request, the bytes of a write, an answer, the bytes of a read) or replays a request. The
transfer must fail with a clear error, never complete with bytes nobody sent."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core.lowlevel import Executor
from monarch.rdma import RDMABufferDropped, RDMAError
from monarch.rdma import _tcp as tcp
from monarch.rdma._chunks import plan
from monarch.rdma._region import Region, region_of
from monarch.rdma._seal import SLICE
from monarch.transport.lowlevel import Handshake

SECRET = os.urandom(32)
CHOICE = 1 + 16
"""Each end's first tagged message: whether it tags the bytes, and its tag."""


def _handshake_sizes() -> dict[str, int]:
    """Bytes each way ("up": to the server) before the first request: the transports'
    handshake (its message sizes are fixed for a given process), then each end's choice."""
    client, server = Handshake("client", SECRET), Handshake("server", SECRET)
    sent = {"up": 0, "down": 0}
    while client.wants_more or server.wants_more:
        up, down = client.data_to_send(), server.data_to_send()
        sent["up"] += len(up)
        sent["down"] += len(down)
        server.receive_data(up)
        client.receive_data(down)
    return {way: size + CHOICE for way, size in sent.items()}


HANDSHAKE = _handshake_sizes()
Mutate = Callable[[str, int, bytes], bytes]
"""(direction "up" (to the server) or "down", offset of the chunk in its stream, chunk)."""


class Cut(Exception):
    """Raised by a ``Mutate``: the relay forwards ``last`` and dies (both ways shut)."""

    def __init__(self, last: bytes) -> None:
        super().__init__("the relay died")
        self.last = last


@contextmanager
def relay(target: tuple[str, int], mutate: Mutate) -> Iterator[tuple[str, int]]:
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def pump(src: socket.socket, dst: socket.socket, direction: str) -> None:
        offset = 0
        try:
            while data := src.recv(65536):
                dst.sendall(mutate(direction, offset, data))
                offset += len(data)
        except Cut as cut:
            with suppress(OSError):
                dst.sendall(cut.last)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(target)
            threading.Thread(target=pump, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, "down"), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[:2]
    finally:
        stop.set()
        listener.close()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[tcp.DataServer, dict[int, Region]]]:
    regions: dict[int, Region] = {}
    served = tcp.DataServer("127.0.0.1", SECRET, regions.get)
    yield served, regions
    served.close()


def move(
    address: tuple[str, int],
    op: int,
    local: bytearray | memoryview,
    size: int,
    integrity: bool = True,
) -> None:
    streams = tcp.Streams(address[0], address[1], SECRET, integrity)
    try:
        with Executor(1) as helpers:
            tcp.transfer(
                streams,
                op,
                1,
                region_of(local),
                size,
                time.monotonic() + 20,
                plan(size, 1, size, 1),
                helpers,
                1,
            )
    finally:
        streams.close()


def flip_at(direction: str, position: int) -> Mutate:
    """Change the byte at ``position`` after the handshake in one direction."""

    def mutate(way: str, offset: int, data: bytes) -> bytes:
        at = HANDSHAKE[direction] + position - offset
        if way != direction or not 0 <= at < len(data):
            return data
        return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]

    return mutate


def untouched(way: str, offset: int, data: bytes) -> bytes:
    return data


SIZE = 4096
REQUEST = 25 + 16  # header and its tag
ANSWER = 1  # status, before a read's bytes


Served = tuple[tcp.DataServer, dict[int, Region]]


def test_an_untouched_relay_moves_the_bytes(server: Served) -> None:
    served, regions = server
    remote = bytearray(os.urandom(SIZE))
    regions[1] = region_of(remote)
    local = bytearray(SIZE)
    with relay((served.host, served.port), untouched) as address:
        move(address, tcp.READ, local, SIZE)
    assert local == remote


def _span(size: int, writes: bool, up: bool) -> int:
    """Bytes one way after the handshake of a transfer of ``size`` bytes."""
    if up:
        return REQUEST + (size + 16 if writes else 0)  # a read's request has no bytes
    return ANSWER + (size if not writes else 0) + 16


@settings(max_examples=30, deadline=None)
@given(
    writes=st.booleans(),
    up=st.booleans(),
    position=st.integers(0, REQUEST + SIZE + 16 - 1),
)
def test_any_changed_byte_fails_the_transfer(
    server: tuple[tcp.DataServer, dict[int, Region]], writes: bool, up: bool, position: int
) -> None:
    served, regions = server
    remote = bytearray(os.urandom(SIZE))
    regions[1] = region_of(remote)
    local = bytearray(os.urandom(SIZE))
    sent = bytes(local)
    position %= _span(SIZE, writes, up)
    with (
        relay((served.host, served.port), flip_at("up" if up else "down", position)) as address,
        pytest.raises(RDMAError, match=r"authenticate|cut|closed|refused|owner"),
    ):
        move(address, tcp.WRITE if writes else tcp.READ, local, SIZE)
    if writes and up and position < REQUEST:
        assert remote != sent  # a forged request is never acted on: nothing was written


BIG = 2 * SLICE + 4099
"""Several slices: their tags are taken on a bulk thread, one behind the copy."""
GUARD = 4096


def _guarded(size: int) -> tuple[bytearray, memoryview]:
    """A buffer with ``GUARD`` random bytes each side of a ``size``-byte middle."""
    whole = bytearray(os.urandom(GUARD + size + GUARD))
    return whole, memoryview(whole)[GUARD : GUARD + size]


@settings(max_examples=12, deadline=None)
@given(
    writes=st.booleans(),
    up=st.booleans(),
    position=st.integers(0, REQUEST + BIG + 16 - 1),
)
def test_any_changed_byte_of_a_transfer_of_several_slices_fails_it(
    server: Served, writes: bool, up: bool, position: int
) -> None:
    served, regions = server
    remote, remote_middle = _guarded(BIG)
    regions[1] = region_of(remote_middle)
    local, local_middle = _guarded(BIG)
    before_remote, before_local = bytes(remote), bytes(local)
    position %= _span(BIG, writes, up)
    with (
        relay((served.host, served.port), flip_at("up" if up else "down", position)) as address,
        pytest.raises(RDMAError, match=r"authenticate|cut|closed|refused|owner"),
    ):
        move(address, tcp.WRITE if writes else tcp.READ, local_middle, BIG)
    # nothing outside the ranges moved, whichever way the bytes went
    assert remote[:GUARD] == before_remote[:GUARD] and remote[-GUARD:] == before_remote[-GUARD:]
    assert local[:GUARD] == before_local[:GUARD] and local[-GUARD:] == before_local[-GUARD:]
    if writes:
        assert local == before_local  # a write's source is only read


@settings(max_examples=10, deadline=None)
@given(writes=st.booleans(), up=st.booleans(), cut=st.integers(0, 1 << 30))
def test_a_peer_gone_mid_transfer_fails_it_and_writes_nothing_outside_the_range(
    server: Served, writes: bool, up: bool, cut: int
) -> None:
    """The relay dies after ``cut`` bytes one way (a peer gone mid-transfer, between or
    inside slices): the transfer fails with a clear error, and the bytes around both
    ranges stay as they were."""
    served, regions = server
    remote, remote_middle = _guarded(BIG)
    regions[1] = region_of(remote_middle)
    local, local_middle = _guarded(BIG)
    before_remote, before_local = bytes(remote), bytes(local)
    direction = "up" if up else "down"
    cut %= _span(BIG, writes, up)  # before the last byte that matters

    def die(way: str, offset: int, data: bytes) -> bytes:
        end = HANDSHAKE[direction] + cut - offset
        if way == direction and end < len(data):
            raise Cut(data[: max(end, 0)])  # the bytes before ``cut`` go on, then nothing
        return data

    with (
        relay((served.host, served.port), die) as address,
        pytest.raises(RDMAError, match=r"cut|closed|owner|authenticate"),
    ):
        move(address, tcp.WRITE if writes else tcp.READ, local_middle, BIG)
    assert remote[:GUARD] == before_remote[:GUARD] and remote[-GUARD:] == before_remote[-GUARD:]
    assert local[:GUARD] == before_local[:GUARD] and local[-GUARD:] == before_local[-GUARD:]


def test_a_replayed_request_is_refused(server: Served) -> None:
    served, regions = server
    remote = bytearray(SIZE)
    regions[1] = region_of(remote)
    write = REQUEST + SIZE + 16  # a whole write on the wire: request, bytes, their tag
    recorded = bytearray()

    def replay(way: str, offset: int, data: bytes) -> bytes:
        """Record the first write; send it again in place of the second."""
        if way != "up":
            return data
        out = bytearray(data)
        for i in range(len(data)):
            at = offset + i - HANDSHAKE["up"]
            if 0 <= at < write:
                recorded.append(data[i])
            elif write <= at < 2 * write:
                out[i] = recorded[at - write]
        return bytes(out)

    local = bytearray(b"\x07" * SIZE)
    chunks = plan(SIZE, 1, SIZE, 1)
    with relay((served.host, served.port), replay) as address:
        streams = tcp.Streams(address[0], address[1], SECRET)
        with Executor(1) as helpers:
            deadline = time.monotonic() + 20
            tcp.transfer(
                streams, tcp.WRITE, 1, region_of(local), SIZE, deadline, chunks, helpers, 1
            )
            assert remote == local
            local[:] = b"\x09" * SIZE
            with pytest.raises(RDMAError, match=r"cut|closed|authenticate"):
                tcp.transfer(
                    streams, tcp.WRITE, 1, region_of(local), SIZE, deadline, chunks, helpers, 1
                )
        streams.close()
    assert remote == b"\x07" * SIZE  # the replayed request was not acted on


@contextmanager
def untagging_server() -> Iterator[Served]:
    """A data server whose owner turned ``rdma_tcp_integrity`` off."""
    regions: dict[int, Region] = {}
    served = tcp.DataServer("127.0.0.1", SECRET, regions.get, integrity=False)
    try:
        yield served, regions
    finally:
        served.close()


def test_with_integrity_off_on_both_ends_the_bytes_go_untagged_the_requests_tagged() -> None:
    with untagging_server() as (served, regions):
        remote = bytearray(os.urandom(SIZE))
        regions[1] = region_of(remote)
        local = bytearray(SIZE)
        # A byte of the read's bytes changed on the way lands unseen: the choice made.
        with relay((served.host, served.port), flip_at("down", ANSWER + 7)) as address:
            move(address, tcp.READ, local, SIZE, integrity=False)
        assert local[7] == remote[7] ^ 0x01 and local[8:] == remote[8:]
        # A changed request is still refused.
        with (
            relay((served.host, served.port), flip_at("up", 3)) as address,
            pytest.raises(RDMAError, match=r"cut|closed|refused"),
        ):
            move(address, tcp.READ, local, SIZE, integrity=False)


@pytest.mark.parametrize("size", [5, SIZE])
def test_an_untagged_read_refused_leaves_the_destination_alone(size: int) -> None:
    """The answer's status comes with the first bytes after it (one call each way): a
    refusal's are its tag, never written where the read's bytes would have gone."""
    with untagging_server() as (served, _):
        local = bytearray(b"\x33") * size
        with pytest.raises(RDMABufferDropped):  # no buffer 1 there
            move((served.host, served.port), tcp.READ, local, size, integrity=False)
        assert local == b"\x33" * size


@pytest.mark.parametrize("client_integrity", [True, False])
def test_the_bytes_are_tagged_unless_both_ends_said_no(client_integrity: bool) -> None:
    """An owner that tags (the default) or a client that does: a changed byte is seen."""
    regions: dict[int, Region] = {}
    served = tcp.DataServer("127.0.0.1", SECRET, regions.get, integrity=not client_integrity)
    try:
        regions[1] = region_of(bytearray(os.urandom(SIZE)))
        with (
            relay((served.host, served.port), flip_at("down", ANSWER + 7)) as address,
            pytest.raises(RDMAError, match="authenticate"),
        ):
            move(address, tcp.READ, bytearray(SIZE), SIZE, integrity=client_integrity)
    finally:
        served.close()


@pytest.mark.parametrize("end", ["up", "down"])
def test_a_choice_changed_in_the_handshake_fails_it(server: Served, end: str) -> None:
    """A relay cannot talk the ends out of tagging: each end's choice is tagged under the
    keys of the handshake."""
    served, regions = server
    regions[1] = region_of(bytearray(SIZE))

    def downgrade(way: str, offset: int, data: bytes) -> bytes:
        at = HANDSHAKE[end] - CHOICE - offset  # the choice: the byte after the handshake
        if way != end or not 0 <= at < len(data):
            return data
        return data[:at] + b"\x00" + data[at + 1 :]

    with (
        relay((served.host, served.port), downgrade) as address,
        pytest.raises(RDMAError, match=r"secret|handshake|cut|closed"),
    ):
        move(address, tcp.READ, bytearray(SIZE), SIZE)


def test_a_flood_of_silent_connections_neither_holds_a_thread_each_nor_locks_peers_out() -> None:
    """Ten times the cap of connections that never prove the secret (each connected and
    went quiet): the server keeps the newest ``MAX_PENDING_HANDSHAKES``, closing the rest,
    and a peer with the secret still moves its bytes."""
    regions: dict[int, Region] = {}
    served = tcp.DataServer("127.0.0.1", SECRET, regions.get)
    flood: list[socket.socket] = []
    try:
        cap = tcp.MAX_PENDING_HANDSHAKES
        flood = [socket.create_connection((served.host, served.port)) for _ in range(10 * cap)]

        def evicted() -> int:
            gone = 0
            for sock in flood:
                sock.setblocking(False)
                try:
                    while chunk := sock.recv(4096):  # nothing until the end
                        del chunk
                    gone += 1
                except BlockingIOError:
                    pass
                except OSError:
                    gone += 1
            return gone

        deadline = time.monotonic() + 30
        while evicted() < 9 * cap and time.monotonic() < deadline:
            time.sleep(0.01)
        assert evicted() == 9 * cap  # the newest cap still wait for their proof

        def serving() -> int:
            return sum(t.name == "monarch-rdma-tcp-conn" for t in threading.enumerate())

        while serving() > cap and time.monotonic() < deadline:  # evicted threads ending
            time.sleep(0.01)
        assert serving() <= cap
        remote = bytearray(os.urandom(SIZE))
        regions[1] = region_of(remote)
        local = bytearray(SIZE)
        move((served.host, served.port), tcp.READ, local, SIZE)
        assert local == remote
    finally:
        for sock in flood:
            sock.close()
        served.close()
