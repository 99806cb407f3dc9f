"""Push mode (``PushReceiver.start_receiving``): the loop reads, the receiver is called back.

Real sockets on every transport; the asyncio backend reads in push mode, trio declines
it (``start_receiving`` returns False and ``receive`` goes on working).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import (
    Connection,
    ConnectionAttribute,
    ConnectionClosed,
    ProtocolError,
    TransportError,
)

from .conftest import Endpoint, chunked_frames, fast, push, raw_frames, serving, write_in_pieces  # type: ignore[import-not-found]

pytestmark = pytest.mark.anyio


class Pushed:
    """What push mode hands a receiver: frames, then the error that ended them. Each
    ``receive_nowait`` is checked against ``frames_ready`` asked just before it: False
    exactly when it raises ``anyio.WouldBlock`` (``wait_for`` fails on a mismatch)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.frames: list[list[bytes]] = []
        self.error: BaseException | None = None
        self.calls = 0
        self.changed = anyio.Event()
        self.mismatches: list[str] = []

    def __call__(self) -> None:
        self.calls += 1
        receiver = push(self.conn)
        try:
            while True:
                ready = receiver.frames_ready()
                try:
                    frame = receiver.receive_nowait()
                except anyio.WouldBlock:
                    if ready:
                        self.mismatches.append("ready, but receive_nowait would block")
                    raise
                except TransportError:
                    if not ready:
                        self.mismatches.append("not ready, but receive_nowait raised its end")
                    raise
                if not ready:
                    self.mismatches.append("not ready, but receive_nowait had a frame")
                self.frames.append([bytes(p) for p in frame])
        except anyio.WouldBlock:
            pass
        except TransportError as exc:
            self.error = exc
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, frames: int = 0, error: bool = False) -> None:
        with anyio.fail_after(10):
            while len(self.frames) < frames or (error and self.error is None):
                await self.changed.wait()
        assert self.mismatches == []


async def pushing(endpoint: Endpoint, server: object) -> tuple[Connection, Connection, Pushed]:
    client = await endpoint.connect(server.listener)  # type: ignore[attr-defined]
    peer = await server.next_connection()  # type: ignore[attr-defined]
    pushed = Pushed(peer)
    assert push(peer).start_receiving(pushed)
    return client, peer, pushed


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_declines_push_mode_and_receive_still_works(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        assert not push(peer).start_receiving(lambda: None)
        await client.send([b"still", b"works"])
        assert [bytes(p) for p in await peer.receive()] == [b"still", b"works"]
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_every_frame_arrives_in_order_with_large_ones_among_them(
    endpoint: Endpoint,
) -> None:
    big = os.urandom(3 * 1024 * 1024)
    async with serving(endpoint) as server:
        client, _, pushed = await pushing(endpoint, server)
        sent = []
        for i in range(300):
            parts = [b"n", str(i).encode(), big if i % 100 == 7 else b"x" * (i % 50)]
            sent.append(parts)
            fast(client).send_nowait(parts)
        await fast(client).flush()
        await pushed.wait_for(frames=len(sent))
        assert pushed.frames == sent
        assert pushed.error is None
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_frames_read_before_push_mode_are_pushed_too(endpoint: Endpoint) -> None:
    """Frames that receive() read along with the one it returned come first."""
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        for i in range(3):
            fast(client).send_nowait([str(i).encode()])
        await fast(client).flush()
        first = [bytes(p) for p in await peer.receive()]
        pushed = Pushed(peer)
        assert push(peer).start_receiving(pushed)
        await client.send([b"3"])
        await pushed.wait_for(frames=3)
        assert [first, *pushed.frames] == [[b"0"], [b"1"], [b"2"], [b"3"]]
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_peer_closing_is_reported_after_the_last_frame(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client, peer, pushed = await pushing(endpoint, server)
        await client.send([b"last"])
        await client.aclose()
        await pushed.wait_for(frames=1, error=True)
        assert pushed.frames == [[b"last"]]
        assert isinstance(pushed.error, ConnectionClosed)
        assert push(peer).closed


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_closing_our_side_calls_the_receiver_back(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client, peer, pushed = await pushing(endpoint, server)
        await peer.aclose()
        await pushed.wait_for(error=True)
        assert isinstance(pushed.error, ConnectionClosed)
        with pytest.raises(ConnectionClosed):
            await peer.receive()
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_receive_is_refused_while_pushing(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client, peer, pushed = await pushing(endpoint, server)
        with pytest.raises(anyio.BusyResourceError):
            await peer.receive()
        with pytest.raises(anyio.BusyResourceError):
            push(peer).start_receiving(pushed)
        await client.send([b"after"])
        await pushed.wait_for(frames=1)
        assert pushed.frames == [[b"after"]]
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("url", ["unix://@", "tcp://127.0.0.1:0"])
async def test_a_malformed_frame_ends_push_mode_with_a_protocol_error(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "monarch.transport")
    endpoint = Endpoint(url)
    async with serving(endpoint, max_parts=8) as server:
        client, peer, pushed = await pushing(endpoint, server)
        raw = client.extra(ConnectionAttribute.raw_socket)
        raw.send(b"\xff\xff\xff\x7f garbage")  # claims 2**31 parts
        await pushed.wait_for(error=True)
        assert isinstance(pushed.error, ProtocolError)
        assert "max_parts=8" in caplog.text
        assert push(peer).closed
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("url", ["unix://@", "tcp://127.0.0.1:0"])
async def test_the_peer_closing_mid_frame_is_a_protocol_error(url: str) -> None:
    endpoint = Endpoint(url)
    async with serving(endpoint) as server:
        client, _, pushed = await pushing(endpoint, server)
        raw = client.extra(ConnectionAttribute.raw_socket)
        whole = raw_frames(client, [b"complete"])
        half = raw_frames(client, [b"x" * 1000])[:500]
        raw.sendall(whole + half)
        raw.shutdown(socket.SHUT_WR)
        await pushed.wait_for(frames=1, error=True)
        assert pushed.frames == [[b"complete"]]
        assert isinstance(pushed.error, ProtocolError)
        assert "mid-frame" in str(pushed.error)
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_thread_failing_a_send_ends_push_mode(endpoint: Endpoint) -> None:
    """A write from another thread that fails closes the connection on the loop, and the
    receiver hears of it (no reader left registered on a closed socket)."""
    async with serving(endpoint) as server:
        client, peer, pushed = await pushing(endpoint, server)
        failed = threading.Event()

        def write() -> None:
            try:
                while True:
                    fast(peer).send_nowait([b"y" * 5000])
                    fast(peer).flush_nowait()
            except ConnectionClosed:
                failed.set()

        writer = threading.Thread(target=write, daemon=True)
        await client.aclose()
        writer.start()
        await pushed.wait_for(error=True)
        assert isinstance(pushed.error, ConnectionClosed)
        await anyio.to_thread.run_sync(writer.join, 10)
        assert failed.is_set()


# -- pausing (backpressure): a paused receiver leaves frames in the kernel's buffers ----

FLOOD = 64 * 1024 * 1024
"""More than any socket buffers hold: a sender to a paused receiver must fill them."""


def queue_flood(client: Connection, count: int) -> list[list[bytes]]:
    sent = [[str(i).encode(), b"x" * (FLOOD // count)] for i in range(count)]
    for parts in sent:
        fast(client).send_nowait(parts)
    return sent


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_paused_receiver_stalls_its_sender_and_resumes_in_order(
    endpoint: Endpoint,
) -> None:
    async with serving(endpoint) as server:
        client, peer, pushed = await pushing(endpoint, server)
        push(peer).pause_receiving()
        push(peer).pause_receiving()  # idempotent
        sent = queue_flood(client, 64)
        assert fast(client).unsent > 0
        assert not fast(client).flush_nowait()  # the buffers are full: nobody reads them
        assert 0 < fast(client).unsent < FLOOD
        assert len(pushed.frames) < len(sent)
        push(peer).resume_receiving()
        await fast(client).flush()
        assert fast(client).unsent == 0
        await pushed.wait_for(frames=len(sent))
        assert pushed.frames == sent
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_paused_receiver_still_learns_that_we_closed(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client, peer, pushed = await pushing(endpoint, server)
        push(peer).pause_receiving()
        await peer.aclose()
        await pushed.wait_for(error=True)
        assert isinstance(pushed.error, ConnectionClosed)
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_flush_for_writes_within_its_time_or_says_it_could_not(
    endpoint: Endpoint,
) -> None:
    """A sender that cannot await (backpressure on the loop's own thread) blocks in
    ``flush_for``: bounded while the peer does not read, done once it does."""
    async with serving(endpoint) as server:
        client, peer, pushed = await pushing(endpoint, server)
        push(peer).pause_receiving()
        sent = queue_flood(client, 16)
        assert not fast(client).flush_for(0.01)  # nobody reads: it gives up in time
        left = fast(client).unsent
        assert left > 0
        # The kernel may still take some (its buffers grow: tcp_rmem's max is 32 MiB here),
        # never all that is left while nobody reads.
        assert not fast(client).flush_for(0.01, keep=0)
        push(peer).resume_receiving()
        assert await anyio.to_thread.run_sync(fast(client).flush_for, 60.0)
        assert fast(client).unsent == 0
        await pushed.wait_for(frames=len(sent))
        assert pushed.frames == sent
        await client.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_send_threadsafe_from_threads_and_the_loop_at_once(endpoint: Endpoint) -> None:
    """Heartbeats go from a thread of their own while the loop sends on the same
    connection: every frame arrives whole (MACs and all), each sender's in its order."""
    async with serving(endpoint) as server:
        client, _, pushed = await pushing(endpoint, server)
        count = 300

        def beat(name: bytes) -> None:
            for i in range(count):
                fast(client).send_threadsafe([name, str(i).encode()])

        threads = [threading.Thread(target=beat, args=(b"t%d" % n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for i in range(count):
            if not fast(client).send_threadsafe([b"loop", str(i).encode(), b"x" * (i * 97)]):
                await fast(client).flush()
            if i % 50 == 0:
                await anyio.lowlevel.checkpoint()
        for thread in threads:
            await anyio.to_thread.run_sync(thread.join)
        assert await anyio.to_thread.run_sync(fast(client).flush_for, 60.0)
        await pushed.wait_for(frames=3 * count)
        assert pushed.error is None
        by_sender: dict[bytes, list[int]] = {}
        for frame in pushed.frames:
            by_sender.setdefault(frame[0], []).append(int(frame[1]))
        assert by_sender == {name: list(range(count)) for name in (b"loop", b"t0", b"t1")}
        await client.aclose()


# -- any chunking (hypothesis): bytes written in arbitrary pieces by a raw peer ----------


@settings(max_examples=30, deadline=None)
@given(frames=chunked_frames, data=st.data())
def test_push_mode_reassembles_frames_under_any_chunking(
    frames: list[list[bytes]], data: st.DataObject
) -> None:
    cut_at = data.draw(st.lists(st.floats(0, 1), max_size=20))

    async def main() -> list[list[bytes]]:
        endpoint = Endpoint("unix://@")
        async with serving(endpoint) as server:
            client, _, pushed = await pushing(endpoint, server)
            await asyncio.to_thread(write_in_pieces, client, frames, cut_at)
            await pushed.wait_for(frames=len(frames))
            await client.aclose()
            return pushed.frames

    assert asyncio.run(main()) == frames
