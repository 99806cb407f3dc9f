"""The thin contract (``send``, ``receive``, ``aclose``, typed extra attributes) on both
anyio backends (the root conftest runs each test on asyncio and trio) and every built-in
transport; what a connection offers beyond it (the fast
path, push mode) is found through its attributes."""

from __future__ import annotations

import os
import socket
import threading

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import (
    Address,
    Connection,
    ConnectionAttribute,
    ConnectionClosed,
    FrameQueue,
    PushReceiver,
)
from monarch.transport.testing import Thin
from monarch.transport.wire import PROTOCOL_VERSION

from .conftest import Endpoint, chunked_frames, serving, write_in_pieces  # type: ignore[import-not-found]

pytestmark = pytest.mark.anyio


def test_the_contract_is_send_receive_and_aclose() -> None:
    assert Connection.__abstractmethods__ == {"send", "receive", "aclose"}


async def test_frames_round_trip_through_the_contract(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        for i in range(20):
            await client.send([b"n", str(i).encode(), b"x" * (i * 1000)])
        for i in range(20):
            assert [bytes(p) for p in await peer.receive()] == [
                b"n",
                str(i).encode(),
                b"x" * (i * 1000),
            ]
        await peer.send([b"bye"])
        await peer.aclose()
        got = [[bytes(p) for p in frame] async for frame in client]  # ends at end of stream
        assert got == [[b"bye"]]
        with pytest.raises(ConnectionClosed):
            await client.receive()
        await client.aclose()
        await client.aclose()  # idempotent


async def test_typed_attributes_describe_the_connection(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        scheme = server.listener.address.scheme
        for conn in (client, peer):
            assert conn.extra(ConnectionAttribute.transport) == scheme
            assert conn.extra(ConnectionAttribute.protocol_version) == PROTOCOL_VERSION
            assert isinstance(conn.extra(ConnectionAttribute.local_address), Address)
            assert isinstance(conn.extra(ConnectionAttribute.raw_socket), socket.socket)
            # The fast path and push mode are capabilities the connection offers.
            assert isinstance(conn.extra(ConnectionAttribute.frame_queue), FrameQueue)
            assert isinstance(conn.extra(ConnectionAttribute.push_receiver), PushReceiver)
        assert client.extra(ConnectionAttribute.remote_address) == server.listener.address
        if scheme == "tcp":
            assert peer.extra(ConnectionAttribute.remote_address) == client.extra(
                ConnectionAttribute.local_address
            )
        if scheme == "unix":
            pid, _, _ = peer.extra(ConnectionAttribute.peer_credentials)
            assert pid == os.getpid()
        if scheme != "tls":  # an attribute a connection lacks: the default, or a lookup error
            assert client.extra(ConnectionAttribute.ssl_object, None) is None
            with pytest.raises(anyio.TypedAttributeLookupError):
                client.extra(ConnectionAttribute.ssl_object)
        else:
            assert client.extra(ConnectionAttribute.ssl_object).version() is not None
        await client.aclose()


async def test_a_connection_with_only_the_contract_offers_no_capabilities(
    endpoint: Endpoint,
) -> None:
    async with serving(endpoint) as server:
        client = Thin(await endpoint.connect(server.listener))
        peer = await server.next_connection()
        assert client.extra(ConnectionAttribute.frame_queue, None) is None
        assert client.extra(ConnectionAttribute.push_receiver, None) is None
        assert client.extra(ConnectionAttribute.transport) == "thin"
        async with client:
            await client.send([b"plain"])
            assert [bytes(p) for p in await peer.receive()] == [b"plain"]


async def test_the_fast_path_queues_and_writes_in_one_call(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        queue = client.extra(ConnectionAttribute.frame_queue)
        for i in range(50):
            queue.send_nowait([str(i).encode()])
        assert queue.unsent > 0  # queued, nothing written yet
        await queue.flush()
        assert queue.unsent == 0
        sender = threading.Thread(target=queue.send_threadsafe, args=([b"from a thread"], 10.0))
        sender.start()
        await anyio.to_thread.run_sync(sender.join)
        await client.send([b"last"])  # the plain send writes behind what the queue held
        got = [bytes((await peer.receive())[0]) for _ in range(52)]
        assert got == [*(str(i).encode() for i in range(50)), b"from a thread", b"last"]
        await client.aclose()


# -- any chunking (hypothesis): receive() reassembles what a raw peer writes in pieces -----


@settings(max_examples=20, deadline=None)
@given(frames=chunked_frames, data=st.data(), backend=st.sampled_from(["asyncio", "trio"]))
def test_receive_reassembles_frames_under_any_chunking(
    frames: list[list[bytes]], data: st.DataObject, backend: str
) -> None:
    cut_at = data.draw(st.lists(st.floats(0, 1), max_size=20))

    async def main() -> list[list[bytes]]:
        endpoint = Endpoint("unix://@")
        async with serving(endpoint) as server:
            client = await endpoint.connect(server.listener)
            peer = await server.next_connection()
            got: list[list[bytes]] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, write_in_pieces, client, frames, cut_at)
                with anyio.fail_after(30):
                    for _ in frames:
                        got.append([bytes(p) for p in await peer.receive()])
            await client.aclose()
            return got

    assert anyio.run(main, backend=backend) == frames
