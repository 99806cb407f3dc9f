"""Random bytes thrown at a listener never crash it or reach a handler."""

from __future__ import annotations

import random
import struct

import anyio
import pytest

from monarch.transport import Address, Connection, TransportError
from monarch.transport.wire import MAGIC, ClientHello, Handshake, encode

from .conftest import SECRET, Endpoint, serving  # type: ignore[import-not-found]

pytestmark = pytest.mark.anyio


def payloads(rng: random.Random) -> list[bytes]:
    """Garbage of several shapes: raw noise, noise after the magic, a bad hello."""
    hello = encode(ClientHello(1, 1, rng.randbytes(32)))
    out = []
    for _ in range(40):
        noise = rng.randbytes(rng.randint(0, 300))
        shape = rng.randrange(5)
        if shape == 0:
            out.append(noise)
        elif shape == 1:
            out.append(MAGIC + noise)
        elif shape == 2:
            out.append(MAGIC + struct.pack(">H", len(noise)) + noise)
        elif shape == 3:
            mangled = bytearray(hello)
            mangled[rng.randrange(len(mangled))] ^= rng.randint(1, 255)
            out.append(MAGIC + struct.pack(">H", len(mangled)) + bytes(mangled) + noise)
        else:
            out.append(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + noise)
    return out


async def _raw(address: Address) -> anyio.abc.SocketStream:
    if address.scheme == "unix":
        return await anyio.connect_unix("\0" + address.host[1:])
    assert address.port is not None
    return await anyio.connect_tcp(address.host, address.port)


@pytest.mark.parametrize("url", ["unix://@", "tcp://127.0.0.1:0"])
async def test_listener_survives_random_bytes(url: str) -> None:
    endpoint = Endpoint(url)
    rng = random.Random(1234)
    async with serving(endpoint, handshake_timeout=2) as server:
        for data in payloads(rng):
            raw = await _raw(server.listener.address)
            try:
                await raw.send(data)
                await raw.send_eof()
                with anyio.fail_after(5):
                    # The listener answers (a Reject at most) and closes on us.
                    while await raw.receive():
                        pass
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
            finally:
                await raw.aclose()
        good = await endpoint.connect(server.listener)
        await good.send([b"still serving"])
        peer = await server.next_connection()
        assert bytes((await peer.receive())[0]) == b"still serving"
        await good.aclose()


async def _drain(conn: Connection) -> None:
    while True:
        await conn.receive()


@pytest.mark.parametrize("url", ["unix://@", "tcp://127.0.0.1:0"])
async def test_authenticated_garbage_frames_close_only_that_connection(url: str) -> None:
    """A peer with the secret that then sends noise is cut off; the listener lives on."""
    endpoint = Endpoint(url)
    rng = random.Random(99)
    async with serving(endpoint, max_frame_size=1 << 20, max_parts=64) as server:
        for _ in range(20):
            raw = await _raw(server.listener.address)
            handshake = Handshake("client", SECRET)
            await raw.send(handshake.data_to_send())
            while handshake.wants_more:
                handshake.receive_data(await raw.receive())
                if out := handshake.data_to_send():
                    await raw.send(out)
            peer = await server.next_connection()
            await raw.send(rng.randbytes(rng.randint(4, 2000)))
            await raw.send_eof()
            # Noise may parse as frames until it doesn't: then a protocol error or,
            # at a frame boundary, a clean end of stream.
            with anyio.fail_after(5), pytest.raises(TransportError):
                await _drain(peer)
            await raw.aclose()
        good = await endpoint.connect(server.listener)
        await good.send([b"ok"])
        assert bytes((await (await server.next_connection()).receive())[0]) == b"ok"
        await good.aclose()
