"""A relay on the path between two real peers, without the secret, over real sockets.

It forwards the handshake untouched (so both peers authenticate through it), then parses
the frames it carries and attacks them: injects its own, replays, reorders, changes or
cuts them. The receiver must close the connection with a logged reason before handing
out anything that did not come, as it is, in order, from its authenticated peer.
"""

from __future__ import annotations

import logging
import os
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.abc import ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSStream

from monarch.transport import (
    AuthenticationError,
    Connection,
    ConnectionAttribute,
    FrameAuthenticationError,
    Listener,
    ProtocolError,
    TransportError,
    _handshake,
    open_connection,
    open_listener,
)
from monarch.transport._mac import SEAL_HEADER, SEAL_SIZE
from monarch.transport.wire import MAGIC, TAG_SIZE

from .conftest import SECRET  # type: ignore[import-not-found]

pytestmark = pytest.mark.anyio

FRAMES = [[b"frame 0"], [b"frame 1", os.urandom(300_000)], [b"frame 2"]]
Attack = Callable[[list[bytes]], list[bytes]]
"""The genuine frames of one direction -> what the relay sends instead. Each is its wire
bytes with its seal: the peers send each frame alone, so each is a run of its own."""


def passthrough(frames: list[bytes]) -> list[bytes]:
    return frames


async def _read_frame(reader: BufferedByteReceiveStream) -> bytes:
    """One frame and the seal after it."""
    head = await reader.receive_exactly(4)
    (count,) = struct.unpack("<I", head)
    sizes = await reader.receive_exactly(8 * count) if count else b""
    body = sum(struct.unpack(f"<{count}Q", sizes))
    frame = head + sizes + await reader.receive_exactly(body)
    seal = await reader.receive_exactly(SEAL_SIZE)
    assert seal.startswith(SEAL_HEADER)
    return frame + seal


async def _pipe(
    source: ByteStream, sink: ByteStream, *, magic: bool, attack: Attack | None
) -> None:
    """Forward the two handshake messages of this direction as they are, then the
    frames: parsed, all of them, and as ``attack`` has them, then the end of the stream
    (without ``attack``: bytes as they come)."""
    reader = BufferedByteReceiveStream(source)
    try:
        if attack is None:
            while True:
                await sink.send(await source.receive())
        if magic:
            await sink.send(await reader.receive_exactly(len(MAGIC)))
        for _ in range(2):
            (size,) = struct.unpack(">H", await reader.receive_exactly(2))
            await sink.send(struct.pack(">H", size) + await reader.receive_exactly(size))
        frames = []
        for _ in FRAMES:
            frames.append(await _read_frame(reader))
        for data in attack(frames):
            await sink.send(data)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    finally:
        await sink.aclose()


@asynccontextmanager
async def relay(
    upstream: Listener,
    *,
    to_server: Attack | None = None,
    to_client: Attack | None = None,
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
) -> AsyncIterator[str]:
    """A TCP relay to ``upstream``; yields the address to give the client. With ``tls``
    (server and client contexts) it terminates TLS on both sides and relays plaintext."""
    target = upstream.address
    assert target.port is not None
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:

        async def serve(client: ByteStream) -> None:
            if tls is not None:
                client = await TLSStream.wrap(client, server_side=True, ssl_context=tls[0])
            assert target.port is not None
            server: ByteStream = (
                await anyio.connect_tcp(target.host, target.port)
                if tls is None
                else await anyio.connect_tcp(
                    target.host, target.port, ssl_context=tls[1], tls_hostname=target.host
                )
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _pipe(client, server, magic=True, attack=to_server))
                tg.start_soon(lambda: _pipe(server, client, magic=False, attack=to_client))

        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, serve)
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            yield f"{'tls' if tls else 'tcp'}://127.0.0.1:{port}"
            tg.cancel_scope.cancel()


class Sink:
    """A handler that records the frames it receives and what ended them."""

    def __init__(self) -> None:
        self.frames: list[list[bytes]] = []
        self.error: TransportError | None = None
        self.done = anyio.Event()
        self.send: list[list[bytes]] = []

    async def handler(self, conn: Connection) -> None:
        try:
            for frame in self.send:
                await conn.send(frame)
            while True:
                self.frames.append([bytes(p) for p in await conn.receive()])
        except TransportError as exc:
            self.error = exc
        finally:
            self.done.set()


@asynccontextmanager
async def serving(**options: object) -> AsyncIterator[tuple[Listener, Sink]]:
    sink = Sink()
    listener = await open_listener("tcp://127.0.0.1:0", secret=SECRET, **options)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, sink.handler)
        yield listener, sink
        tg.cancel_scope.cancel()


def inject(frames: list[bytes]) -> list[bytes]:
    payload = b"os.system('rm -rf ~')!"
    forged = struct.pack("<IQ", 1, len(payload)) + payload + SEAL_HEADER + os.urandom(TAG_SIZE)
    return [frames[0], forged, *frames[1:]]


def replay(frames: list[bytes]) -> list[bytes]:
    return [frames[0], frames[0], *frames[1:]]


def reorder(frames: list[bytes]) -> list[bytes]:
    return [frames[0], frames[2], frames[1]]


def change(frames: list[bytes]) -> list[bytes]:
    changed = bytearray(frames[1])
    changed[len(changed) // 2] ^= 1
    return [frames[0], bytes(changed), frames[2]]


def drop(frames: list[bytes]) -> list[bytes]:
    return [frames[0], frames[2]]


def truncate(frames: list[bytes]) -> list[bytes]:
    return [frames[0], frames[1][: len(frames[1]) // 2]]


def unseal(frames: list[bytes]) -> list[bytes]:
    """Frame 1 without its seal: it joins frame 2's run, which frame 2's seal does not cover."""
    return [frames[0], frames[1][:-SEAL_SIZE], frames[2]]


@pytest.mark.parametrize(
    ("attack", "error", "reason"),
    [
        (inject, FrameAuthenticationError, "seal 1 failed authentication"),
        (replay, FrameAuthenticationError, "seal 1 failed authentication"),
        (reorder, FrameAuthenticationError, "seal 1 failed authentication"),
        (change, FrameAuthenticationError, "seal 1 failed authentication"),
        (drop, FrameAuthenticationError, "seal 1 failed authentication"),
        (unseal, FrameAuthenticationError, "seal 1 failed authentication"),
        (truncate, ProtocolError, "mid-frame"),
    ],
)
async def test_the_server_refuses_what_a_relay_changed(
    attack: Attack, error: type[Exception], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "monarch.transport")
    async with serving() as (listener, sink), relay(listener, to_server=attack) as address:
        client = await open_connection(address, secret=SECRET)  # authenticated through it
        for frame in FRAMES:
            await client.send(frame)
        with anyio.fail_after(10):
            await sink.done.wait()
        assert sink.frames == FRAMES[:1]  # what came before the attack, nothing after
        assert isinstance(sink.error, error) and reason in str(sink.error)
        assert "closing connection to tcp://127.0.0.1" in caplog.text and reason in caplog.text
        await client.aclose()
        # The listener serves on.
        direct = await open_connection(listener.address, secret=SECRET)
        await direct.send([b"still serving"])
        await direct.aclose()


async def receive_all(conn: Connection, into: list[list[bytes]]) -> None:
    while True:
        into.append([bytes(p) for p in await conn.receive()])


@pytest.mark.parametrize("attack", [inject, replay, reorder, change, truncate])
async def test_the_client_refuses_what_a_relay_changed(attack: Attack) -> None:
    async with serving() as (listener, sink), relay(listener, to_client=attack) as address:
        sink.send = FRAMES
        client = await open_connection(address, secret=SECRET)
        received: list[list[bytes]] = []
        with anyio.fail_after(10), pytest.raises(ProtocolError):
            await receive_all(client, received)
        assert received == FRAMES[:1]
        await client.aclose()


@pytest.mark.parametrize("poly1305", [True, False])
async def test_large_parts_are_macd_by_poly1305_where_both_sides_can(
    poly1305: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``cryptography`` on both sides (the test environment has it) large parts go
    through Poly1305; without, through SHA-256. Either way a change is caught."""
    if not poly1305:
        monkeypatch.setattr(_handshake, "available_features", lambda: 0)
    async with serving() as (listener, sink), relay(listener, to_server=change) as address:
        client = await open_connection(address, secret=SECRET)
        mac = client._send_mac  # type: ignore[attr-defined]
        assert (mac._part_keys is not None) is poly1305
        for frame in FRAMES:
            await client.send(frame)
        with anyio.fail_after(10):
            await sink.done.wait()
        assert sink.frames == FRAMES[:1]
        assert isinstance(sink.error, FrameAuthenticationError)
        await client.aclose()


async def test_an_untouched_relay_changes_nothing() -> None:
    """The control: the relay's parsing forwards genuine frames that arrive whole."""
    async with (
        serving() as (listener, sink),
        relay(listener, to_server=passthrough) as address,
    ):
        client = await open_connection(address, secret=SECRET)
        for frame in FRAMES:
            await client.send(frame)
        await client.aclose()
        with anyio.fail_after(10):
            await sink.done.wait()
        assert sink.frames == FRAMES


async def test_a_relay_terminating_tls_fails_the_handshake(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext], caplog: pytest.LogCaptureFixture
) -> None:
    """TLS 1.3 frames carry no MAC: the handshake is bound to each side's TLS session, so
    a relay holding a certificate the client trusts still cannot pass it through."""
    caplog.set_level(logging.WARNING, "monarch.transport")
    server_context, client_context = tls_contexts
    sink = Sink()
    async with (
        (
            await open_listener("tls://127.0.0.1:0", secret=SECRET, ssl_context=server_context)
        ) as listener,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(listener.serve, sink.handler)
        async with relay(listener, tls=tls_contexts) as address:
            with pytest.raises(AuthenticationError):
                await open_connection(address, secret=SECRET, ssl_context=client_context)
        # Direct, the same contexts work, and TLS authenticates the frames.
        direct = await open_connection(listener.address, secret=SECRET, ssl_context=client_context)
        assert direct.extra(ConnectionAttribute.ssl_object).version() == "TLSv1.3"
        assert direct._send_mac is None  # type: ignore[attr-defined]
        await direct.aclose()
        tg.cancel_scope.cancel()
    assert "client failed to prove the shared secret" in caplog.text
    assert sink.frames == []


async def test_over_tls_1_2_frames_keep_their_mac(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """TLS 1.2 binds nothing: a relay terminating it passes the handshake, but not a frame."""
    server_context, client_context = tls_contexts
    old = _tls12(client_context)
    sink = Sink()
    async with (
        (
            await open_listener("tls://127.0.0.1:0", secret=SECRET, ssl_context=server_context)
        ) as listener,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(listener.serve, sink.handler)
        async with relay(listener, to_server=inject, tls=(server_context, old)) as address:
            client = await open_connection(address, secret=SECRET, ssl_context=old)
            assert client.extra(ConnectionAttribute.ssl_object).version() == "TLSv1.2"
            assert client._send_mac is not None  # type: ignore[attr-defined]
            for frame in FRAMES:
                await client.send(frame)
            with anyio.fail_after(10):
                await sink.done.wait()
            await client.aclose()
        tg.cancel_scope.cancel()
    assert sink.frames == FRAMES[:1]
    assert isinstance(sink.error, FrameAuthenticationError)


def _tls12(trusting: ssl.SSLContext) -> ssl.SSLContext:
    """A client context like ``trusting`` that speaks TLS 1.2 at most."""
    context = ssl.create_default_context()
    for der in trusting.get_ca_certs(binary_form=True):
        context.load_verify_locations(cadata=der)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context
