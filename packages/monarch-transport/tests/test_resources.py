"""What a hostile peer can make us hold: descriptors while in the handshake, memory for
a frame it never finishes. Real sockets."""

from __future__ import annotations

import gc
import os
import socket
import struct
import tracemalloc
import weakref
from collections.abc import Iterator

import anyio
import pytest
from anyio.abc import SocketStream

from monarch.transport import Address, ConnectionClosed, ProtocolError, open_connection
from monarch.transport._framing import FrameDecoder
from monarch.transport.wire import Handshake

from .conftest import SECRET, Endpoint, serving  # type: ignore[import-not-found]

pytestmark = pytest.mark.anyio

MIB = 1 << 20


def held_by(address: Address) -> int:
    """Connections the listener at ``address`` holds open in this process: sockets whose
    local end is its address, the listening one excepted. (Counting all of the process's
    descriptors also counted those that other tests' processes and threads opened or
    closed meanwhile: CI saw 2 fewer than the listener held.)"""
    if address.scheme == "unix":
        local: object = "\0" + address.host[1:]
    else:
        local = (address.host, address.port)
    names = (local, local.encode()) if isinstance(local, str) else (local,)
    count = 0
    for entry in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(entry)))
        except OSError:  # not a socket, or closed meanwhile
            continue
        with sock:
            try:
                listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                count += not listening and sock.getsockname() in names
            except OSError:
                continue
    return count


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _raw(address: Address) -> SocketStream:
    if address.scheme == "unix":
        return await anyio.connect_unix("\0" + address.host[1:])
    assert address.port is not None
    return await anyio.connect_tcp(address.host, address.port)


# -- a flood of connections that never authenticate ---------------------------------------


@pytest.mark.parametrize("url", ["unix://@", "tcp://127.0.0.1:0"])
async def test_a_flood_of_silent_connections_holds_no_more_than_the_cap(url: str) -> None:
    cap, flood_size = 4, 40
    endpoint = Endpoint(url)
    options = {"max_pending_handshakes": cap, "handshake_timeout": 60, "hello_timeout": 60}
    async with serving(endpoint, **options) as server:
        flood = [await _raw(server.listener.address) for _ in range(flood_size)]
        await anyio.wait_all_tasks_blocked()  # the listener took them all, evicting
        assert held_by(server.listener.address) == cap  # the newest 4 are kept
        for raw in flood[:-cap]:  # the evicted ones were closed
            with anyio.fail_after(10):
                assert await _eof(raw)
        # a peer with the secret gets in while the last of the flood is still open
        good = await endpoint.connect(server.listener)
        await good.send([b"served"])
        assert bytes((await (await server.next_connection()).receive())[0]) == b"served"
        await good.aclose()
        for raw in flood:
            await raw.aclose()


async def _eof(raw: SocketStream) -> bool:
    """Whether the listener closed ``raw`` (read to its end)."""
    try:
        while await raw.receive():
            pass
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        pass
    return True


async def test_a_peer_beyond_the_cap_gets_in_at_once_evicting_the_oldest_silent_one() -> None:
    """Past the cap, the newest connection is not queued behind the flood: the oldest
    unauthenticated one is closed for it (a peer with the secret takes milliseconds)."""
    cap = 2
    endpoint = Endpoint("tcp://127.0.0.1:0")
    options = {"max_pending_handshakes": cap, "handshake_timeout": 60, "hello_timeout": 60}
    async with serving(endpoint, **options) as server:
        flood = [await _raw(server.listener.address) for _ in range(cap)]
        with anyio.fail_after(10):
            conn = await endpoint.connect(server.listener)
            assert await _eof(flood[0])  # the oldest went
        await conn.aclose()
        for raw in flood:
            await raw.aclose()


async def test_a_flood_from_one_address_does_not_evict_a_handshake_from_another() -> None:
    """A peer of 127.0.0.2 midway through its handshake (it has sent one byte) keeps its
    place while 127.0.0.1 opens ten times the cap: the most crowded source evicts its own."""
    cap = 3
    endpoint = Endpoint("tcp://127.0.0.1:0")
    options = {"max_pending_handshakes": cap, "handshake_timeout": 60, "hello_timeout": 60}
    async with serving(endpoint, **options) as server:
        address = server.listener.address
        assert address.port is not None
        slow = await anyio.connect_tcp(address.host, address.port, local_host="127.0.0.2")
        handshake = Handshake("client", SECRET)
        hello = handshake.data_to_send()
        await slow.send(hello[:1])
        await anyio.wait_all_tasks_blocked()
        flood = [await _raw(address) for _ in range(10 * cap)]
        await anyio.wait_all_tasks_blocked()
        await slow.send(hello[1:])
        with anyio.fail_after(10):
            while handshake.wants_more:  # the listener still answers it: not evicted
                handshake.receive_data(await slow.receive())
                if out := handshake.data_to_send():
                    await slow.send(out)
        assert handshake.complete
        await slow.aclose()
        for raw in flood:
            await raw.aclose()


@pytest.mark.parametrize("url", ["unix://@", "tcp://127.0.0.1:0"])
async def test_a_silent_connection_is_closed_at_the_hello_deadline(url: str) -> None:
    """One that sends nothing is cut at ``hello_timeout``, not at ``handshake_timeout``."""
    endpoint = Endpoint(url)
    async with serving(endpoint, handshake_timeout=600, hello_timeout=0.2) as server:
        raw = await _raw(server.listener.address)
        with anyio.fail_after(30):
            assert await _eof(raw)
        await raw.aclose()


async def test_the_hello_deadline_is_positive() -> None:
    with pytest.raises(ValueError, match="hello_timeout must be positive"):
        await Endpoint("tcp://127.0.0.1:0").listen(hello_timeout=0)


async def test_the_cap_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="max_pending_handshakes must be at least 1"):
        await Endpoint("tcp://127.0.0.1:0").listen(max_pending_handshakes=0)


# -- a frame declared large and never finished -------------------------------------------


def test_a_declared_frame_is_not_zero_filled_ahead_of_its_bytes() -> None:
    """Declaring 1 GiB and sending 1 MiB costs about 1 MiB of memory, not 1 GiB."""
    decoder = FrameDecoder()
    before = resident()
    decoder.feed(struct.pack("<IQ", 1, 1 << 30) + bytes(MIB))
    assert decoder.mid_frame
    assert resident() - before < 64 * MIB
    decoder.discard()
    assert not decoder.mid_frame


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Reference cycles stay uncollected: what is freed is freed by reference counts."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


async def test_an_unfinished_frame_is_freed_when_its_peer_goes(no_gc: None, traced: None) -> None:
    """A peer that authenticates, declares 256 MiB, sends 1 MiB and disconnects: the
    buffer is freed as the connection fails (no garbage collection), and the connection
    itself once dropped."""
    declared = 256 * MIB

    async def evil_server(stream: SocketStream) -> None:
        handshake = Handshake("server", SECRET)
        while handshake.wants_more:
            handshake.receive_data(await stream.receive())
            if out := handshake.data_to_send():
                await stream.send(out)
        await stream.send(struct.pack("<IQ", 1, declared) + bytes(MIB))
        await stream.aclose()

    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, evil_server)
            tracemalloc.reset_peak()
            baseline = tracemalloc.get_traced_memory()[0]
            conn = await open_connection(f"tcp://127.0.0.1:{port}", secret=SECRET)
            with pytest.raises(ProtocolError, match="mid-frame"):
                await conn.receive()
            current, peak = tracemalloc.get_traced_memory()
            assert peak - baseline >= declared  # the buffer was there...
            assert current - baseline < 16 * MIB  # ...and is gone, with no collection
            with pytest.raises(ConnectionClosed):
                await conn.receive()
            gone = weakref.ref(conn)
            del conn
            assert gone() is None  # no cycle holds the failed connection
            tg.cancel_scope.cancel()
