"""Fixtures: a listener on every transport, and a client that connects to it."""

from __future__ import annotations

import random
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import trustme
from hypothesis import strategies as st

from monarch.transport import (
    Connection,
    ConnectionAttribute,
    FrameQueue,
    Listener,
    PushReceiver,
    open_connection,
    open_listener,
)
from monarch.transport._framing import encode_frame

SECRET = b"test-secret-0123456789"
WRONG_SECRET = b"not-the-secret-0123456789"


def raw_frames(conn: Connection, *frames: list[bytes]) -> bytes:
    """``frames`` as ``conn`` would send them (tags included, its sequence numbers
    taken), for a test that writes them to the raw socket in pieces of its choosing."""
    mac = conn._send_mac  # type: ignore[attr-defined]
    return b"".join(b"".join(bytes(b) for b in encode_frame(f, mac=mac)[0]) for f in frames)


chunked_frames = st.lists(
    st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.builds(
                lambda seed, n: random.Random(seed).randbytes(n),
                st.integers(),
                st.integers(0, 300_000),
            ),
        ),
        max_size=5,
    ),
    min_size=1,
    max_size=12,
)
"""Frames, small and large parts mixed, for the any-chunking properties."""


def write_in_pieces(conn: Connection, frames: list[list[bytes]], cut_at: list[float]) -> None:
    """Write ``frames`` as ``conn`` would send them, straight to its raw socket from this
    thread, cut at the fractions ``cut_at`` of the stream: each piece its own ``send``, so
    the reader at the other end sees the cuts."""
    raw: socket.socket = conn.extra(ConnectionAttribute.raw_socket)
    stream = raw_frames(conn, *frames)
    cuts = sorted({int(f * len(stream)) for f in cut_at})
    raw.settimeout(10)  # blocking writes from this thread
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        if b > a:
            raw.sendall(stream[a:b])


def fast(conn: Connection) -> FrameQueue:
    """``conn``'s fast send path: every built-in transport offers one."""
    return conn.extra(ConnectionAttribute.frame_queue)


def push(conn: Connection) -> PushReceiver:
    """``conn``'s push-mode reading: every built-in transport offers it."""
    return conn.extra(ConnectionAttribute.push_receiver)


@pytest.fixture(scope="session")
def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


@dataclass
class Endpoint:
    """Where to listen and how to connect, for one transport."""

    url: str
    listen_options: dict[str, Any] = field(default_factory=dict)
    connect_options: dict[str, Any] = field(default_factory=dict)

    async def listen(self, **options: Any) -> Listener:
        return await open_listener(
            self.url, secret=options.pop("secret", SECRET), **{**self.listen_options, **options}
        )

    async def connect(self, listener: Listener, **options: Any) -> Connection:
        return await open_connection(
            listener.address,
            secret=options.pop("secret", SECRET),
            **{**self.connect_options, **options},
        )


@pytest.fixture(params=["unix-abstract", "unix-path", "tcp", "tls"])
def endpoint(
    request: pytest.FixtureRequest, tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]
) -> Iterator[Endpoint]:
    kind = request.param
    if kind == "unix-abstract":
        yield Endpoint("unix://@")
    elif kind == "unix-path":
        with tempfile.TemporaryDirectory() as tmp:
            yield Endpoint(f"unix://{tmp}/listener.sock")
    elif kind == "tcp":
        yield Endpoint("tcp://127.0.0.1:0")
    else:
        server, client = tls_contexts
        yield Endpoint(
            "tls://127.0.0.1:0",
            listen_options={"ssl_context": server},
            connect_options={"ssl_context": client},
        )


class Server:
    """A listener serving in the background; accepted connections arrive in ``accepted``."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self._send, self._receive = anyio.create_memory_object_stream[Connection](100)

    async def handler(self, conn: Connection) -> None:
        await self._send.send(conn)
        await anyio.sleep_forever()  # serve() closes the connection when we return

    async def next_connection(self) -> Connection:
        with anyio.fail_after(10):
            return await self._receive.receive()


@asynccontextmanager
async def serving(endpoint: Endpoint, **options: Any) -> AsyncIterator[Server]:
    """Listen on ``endpoint`` and serve until the block ends."""
    listener = await endpoint.listen(**options)
    server = Server(listener)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handler)
        try:
            yield server
        finally:
            # Close before cancelling: an await in a cancelled scope would raise, and the
            # task group would swallow that cancellation with whatever the block raised.
            with anyio.CancelScope(shield=True):
                await listener.aclose()
            tg.cancel_scope.cancel()
