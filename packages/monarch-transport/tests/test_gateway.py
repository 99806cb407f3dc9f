"""A gateway between real sockets: connecting through it, registering and being reached at
it, what it refuses, and that it carries any bytes unchanged (hypothesis)."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.transport import (
    Address,
    AddressError,
    ConnectError,
    Connection,
    Gateway,
    Listener,
    TransportError,
    get_transport,
    open_connection,
    open_gateway,
    open_listener,
)
from monarch.transport._connect import (
    connect_tcp,
    dial_gateway,
    gateway_proof,
    recv_exactly,
    send_message,
    send_raw,
)
from monarch.transport.wire import GATEWAY_GREETING, GatewayOpen, encode

from .conftest import SECRET, WRONG_SECRET  # type: ignore[import-not-found]

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running_gateway(**options: float) -> AsyncIterator[Gateway]:
    gateway = await open_gateway("tcp://127.0.0.1:0", secret=SECRET, **options)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        tg.start_soon(gateway.serve)
        try:
            yield gateway
        finally:
            await gateway.aclose()
            tg.cancel_scope.cancel()


@asynccontextmanager
async def echo(listener: Listener) -> AsyncIterator[Listener]:
    """Serve ``listener``: every frame comes back with b"echo:" before its first part."""

    async def handler(conn: Connection) -> None:
        async for frame in conn:
            await conn.send([b"echo:" + bytes(frame[0]), *frame[1:]])

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handler)
        try:
            yield listener
        finally:
            await listener.aclose()
            tg.cancel_scope.cancel()


async def round_trip(conn: Connection, payload: bytes) -> list[bytes]:
    await conn.send([b"ping", payload])
    with anyio.fail_after(10):
        return [bytes(part) for part in await conn.receive()]


async def test_a_client_reaches_a_peer_through_the_gateway() -> None:
    async with (
        running_gateway() as gateway,
        echo(await open_listener("tcp://127.0.0.1:0", secret=SECRET)) as peer,
    ):
        conn = await open_connection(peer.address, secret=SECRET, via=str(gateway.address))
        async with conn:
            big = bytes(range(256)) * 8192  # 2 MiB: many reads of the splice
            assert await round_trip(conn, big) == [b"echo:ping", big]
            # The peer sees the gateway, not the client: the connection came from it.
            assert str(gateway.address).startswith("gateway://127.0.0.1:")


async def test_a_flood_of_silent_connections_does_not_lock_clients_out_of_the_gateway() -> None:
    """Ten times its cap of connections that never send a request: the gateway keeps the
    newest, and a client still gets through at once."""
    cap = 4
    async with (
        running_gateway(max_pending_handshakes=cap, handshake_timeout=60) as gateway,
        echo(await open_listener("tcp://127.0.0.1:0", secret=SECRET)) as peer,
    ):
        assert gateway.address.port is not None
        flood = [
            await anyio.connect_tcp(gateway.address.host, gateway.address.port)
            for _ in range(10 * cap)
        ]
        with anyio.fail_after(10):
            conn = await open_connection(peer.address, secret=SECRET, via=str(gateway.address))
        async with conn:
            assert await round_trip(conn, b"x") == [b"echo:ping", b"x"]
        for raw in flood:
            await raw.aclose()


async def test_a_registered_client_is_reached_at_its_route() -> None:
    async with running_gateway() as gateway:
        listener = await open_listener(gateway.address, secret=SECRET)
        route = listener.address
        assert route.scheme == "gateway" and route.port == gateway.address.port
        assert route.host.endswith("@127.0.0.1")
        assert gateway.routes == [route.host.partition("@")[0]]
        async with echo(listener):
            for _ in range(3):  # each connection is announced and dialed back anew
                async with await open_connection(route, secret=SECRET) as conn:
                    assert await round_trip(conn, b"x") == [b"echo:ping", b"x"]
        with anyio.fail_after(10):
            while gateway.routes:  # noqa: ASYNC110 - the registration ends with the listener
                await anyio.sleep(0.01)


async def test_refusals_are_connect_errors_that_say_why() -> None:
    async with running_gateway(connect_timeout=2) as gateway:
        via = str(gateway.address)
        route = f"gateway://abc123@127.0.0.1:{gateway.address.port}"
        with pytest.raises(ConnectError, match="no client abc123 is registered"):
            await open_connection(route, secret=SECRET)
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()
        with pytest.raises(ConnectError, match=f"cannot connect to tcp://127.0.0.1:{port}"):
            await open_connection(f"tcp://127.0.0.1:{port}", secret=SECRET, via=via)
        with pytest.raises(ConnectError, match="wrong job secret"):
            await open_connection(f"tcp://127.0.0.1:{port}", secret=WRONG_SECRET, via=via)
        with pytest.raises(AddressError, match="is a gateway, not a peer"):
            await open_connection(gateway.address, secret=SECRET)
        with pytest.raises(ConnectError, match="a gateway is gateway://host:port"):
            await open_connection(f"tcp://127.0.0.1:{port}", secret=SECRET, via="tcp://x:1")


async def test_a_gateway_serves_on_after_bad_peers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "monarch.transport.gateway")
    async with (
        running_gateway(handshake_timeout=1) as gateway,
        echo(await open_listener("tcp://127.0.0.1:0", secret=SECRET)) as peer,
    ):
        assert gateway.address.port is not None
        port = gateway.address.port
        # A wrong proof, garbage under a right proof, an oversized length, silence.
        for attack in ("proof", "garbage", "oversized", "silent"):
            sock = await connect_tcp("127.0.0.1", port)
            try:
                greeting = await recv_exactly(sock, len(GATEWAY_GREETING) + 32)
                nonce = greeting[len(GATEWAY_GREETING) :]
                body = encode(GatewayOpen(str(peer.address)))
                if attack == "proof":
                    await send_message(sock, body, gateway_proof(WRONG_SECRET, nonce, body))
                elif attack == "garbage":
                    await send_message(sock, b"\xc1" * 9, gateway_proof(SECRET, nonce, b"\xc1" * 9))
                elif attack == "oversized":
                    sock.send(struct.pack(">I", 1 << 30))
                with anyio.fail_after(10):  # each is closed, none is served
                    await anyio.wait_readable(sock)
                    assert sock.recv(100) == b""
            finally:
                sock.close()
        text = caplog.text
        assert "did not prove the job's secret" in text and "malformed request" in text
        conn = await open_connection(peer.address, secret=SECRET, via=str(gateway.address))
        async with conn:
            assert await round_trip(conn, b"still") == [b"echo:ping", b"still"]


async def test_a_listener_ends_when_its_gateway_goes() -> None:
    async with running_gateway() as gateway:
        listener = await open_listener(gateway.address, secret=SECRET)

        async def handler(conn: Connection) -> None:
            pass

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, handler)
                await gateway.aclose()  # serve returns: nobody can reach the listener now
        await listener.aclose()


async def test_a_peer_that_is_no_gateway_fails_within_the_connect_timeout() -> None:
    async with echo(await open_listener("tcp://127.0.0.1:0", secret=SECRET)) as peer:
        with pytest.raises(TransportError):
            await open_connection(
                peer.address,
                secret=SECRET,
                via=f"gateway://127.0.0.1:{peer.address.port}",
                connect_timeout=1,
            )


async def raw_echo_server(task_group: anyio.abc.TaskGroup) -> tuple[socket.socket, int]:
    """A plain TCP server that echoes each connection's bytes, then closes its side."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)

    async def one(sock: socket.socket) -> None:
        with sock:
            while True:
                await anyio.wait_readable(sock)
                data = sock.recv(65536)
                if not data:
                    return
                await send_raw(sock, data)

    async def serve() -> None:
        while True:
            await anyio.wait_readable(server)
            sock, _ = server.accept()
            sock.setblocking(False)
            task_group.start_soon(one, sock)

    task_group.start_soon(serve)
    return server, server.getsockname()[1]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chunks=st.lists(st.binary(min_size=1, max_size=70_000), max_size=12))
async def test_the_gateway_carries_any_bytes_unchanged_in_order(chunks: list[bytes]) -> None:
    async with running_gateway() as gateway, anyio.create_task_group() as tg:
        server, port = await raw_echo_server(tg)
        try:
            sock, _ = await dial_gateway(
                gateway.address, GatewayOpen(f"tcp://127.0.0.1:{port}"), SECRET
            )
            with sock:

                async def send_all() -> None:
                    for chunk in chunks:
                        await send_raw(sock, chunk)
                    sock.shutdown(socket.SHUT_WR)  # the half-close travels too

                got = bytearray()
                with anyio.fail_after(20):
                    async with anyio.create_task_group() as sending:
                        sending.start_soon(send_all)
                        while True:
                            await anyio.wait_readable(sock)
                            data = sock.recv(1 << 20)
                            if not data:
                                break
                            got += data
                assert bytes(got) == b"".join(chunks)
        finally:
            server.close()
            tg.cancel_scope.cancel()


def test_addresses() -> None:
    transport = get_transport("gateway")
    assert transport.check_address(Address.parse("gateway://ab12@h:7")).host == "ab12@h"
    for bad in ("gateway://h:0", "gateway://a-b@h:7", "gateway://@:7"):
        with pytest.raises(AddressError):
            transport.check_address(Address.parse(bad))
