"""Connections over real sockets, on every transport and both anyio backends."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from importlib.metadata import entry_points

import anyio
import pytest

from monarch.transport import (
    Address,
    AuthenticationError,
    ConnectError,
    ConnectionAttribute,
    ConnectionClosed,
    FrameTooLarge,
    ProtocolError,
    UnknownTransportError,
    _registry,
    available_transports,
    get_transport,
    open_connection,
    plugin_group,
)
from monarch.transport.wire import PROTOCOL_VERSION

from .conftest import SECRET, WRONG_SECRET, Endpoint, fast, push, serving  # type: ignore[import-not-found]

pytestmark = pytest.mark.anyio


async def test_frames_round_trip_in_order(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        for i in range(200):
            fast(client).send_nowait([b"n", str(i).encode(), b"x" * (i % 7)])
        await fast(client).flush()
        for i in range(200):
            frame = await peer.receive()
            assert [bytes(p) for p in frame] == [b"n", str(i).encode(), b"x" * (i % 7)]
        await peer.send([b"reply"])
        assert [bytes(p) for p in await client.receive()] == [b"reply"]
        await client.aclose()


async def test_large_frame_arrives_intact(endpoint: Endpoint) -> None:
    payload = bytearray(os.urandom(1024)) * (24 * 1024)  # 24 MiB
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.send, [b"head", payload, b"tail"])
            frame = await peer.receive()
        assert bytes(frame[0]) == b"head" and bytes(frame[2]) == b"tail"
        assert frame[1] == payload
        await client.aclose()


async def test_concurrent_senders_never_interleave_frames(endpoint: Endpoint) -> None:
    big = b"B" * 300_000
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()

        async def sender(tag: bytes) -> None:
            for i in range(20):
                await client.send([tag, str(i).encode(), big if i % 5 == 0 else b"s"])

        seen: dict[bytes, list[int]] = {b"a": [], b"b": [], b"c": []}
        async with anyio.create_task_group() as tg:
            for tag in seen:
                tg.start_soon(sender, tag)
            for _ in range(60):
                tag, index, body = (bytes(p) for p in await peer.receive())
                assert body == (big if int(index) % 5 == 0 else b"s")
                seen[tag].append(int(index))
        assert all(indices == list(range(20)) for indices in seen.values())
        await client.aclose()


async def test_typed_attributes(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        scheme = server.listener.address.scheme
        assert client.extra(ConnectionAttribute.transport) == scheme
        assert client.extra(ConnectionAttribute.remote_address) == server.listener.address
        assert peer.extra(ConnectionAttribute.local_address) == server.listener.address
        assert client.extra(ConnectionAttribute.protocol_version) == PROTOCOL_VERSION == 2
        assert isinstance(client.extra(ConnectionAttribute.raw_socket), socket.socket)
        if scheme == "unix":
            assert peer.extra(ConnectionAttribute.peer_credentials)[0] == os.getpid()
        else:
            assert client.extra(ConnectionAttribute.peer_credentials, None) is None
        if scheme == "tls":
            assert client.extra(ConnectionAttribute.ssl_object).version() is not None
        await client.aclose()


async def test_port_zero_reports_the_real_address(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        address = server.listener.address
        assert address.port != 0 and address.host != "@"


async def test_peer_close_ends_iteration_and_further_use_raises(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        await client.send([b"last"])
        await client.aclose()
        assert [[bytes(p) for p in f] async for f in peer] == [[b"last"]]
        with pytest.raises(ConnectionClosed):
            await client.send([b"x"])
        with pytest.raises(ConnectionClosed):
            await client.receive()


async def test_close_flushes_queued_frames(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        for i in range(50):
            fast(client).send_nowait([str(i).encode()])
        await client.aclose()
        assert [bytes(f[0]) async for f in peer] == [str(i).encode() for i in range(50)]


async def test_closing_wakes_a_blocked_receiver(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        await server.next_connection()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def receive() -> None:
                    with pytest.raises(ConnectionClosed):
                        await client.receive()

                tg.start_soon(receive)
                await anyio.wait_all_tasks_blocked()
                await client.aclose()


async def test_oversized_frame_refused_by_sender_connection_still_usable(
    endpoint: Endpoint,
) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener, max_frame_size=1000)
        peer = await server.next_connection()
        with pytest.raises(FrameTooLarge, match="max_frame_size=1000"):
            await client.send([b"x" * 1001])
        await client.send([b"y" * 1000])
        assert bytes((await peer.receive())[0]) == b"y" * 1000
        await client.aclose()


async def test_oversized_frame_refused_by_receiver_closes_with_log(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "monarch.transport")
    async with serving(endpoint, max_frame_size=1000) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        await client.send([b"x" * 1001])
        with pytest.raises(FrameTooLarge, match="max_frame_size=1000"):
            await peer.receive()
        assert push(peer).closed
        assert "max_frame_size=1000" in caplog.text
        # The client sees the connection go away; the listener still serves others.
        with anyio.fail_after(5):
            with pytest.raises(ConnectionClosed):
                await client.receive()
        other = await endpoint.connect(server.listener)
        await other.send([b"ok"])
        assert bytes((await (await server.next_connection()).receive())[0]) == b"ok"
        await other.aclose()


async def test_wrong_secret_is_refused_and_listener_keeps_serving(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "monarch.transport")
    async with serving(endpoint) as server:
        with pytest.raises(AuthenticationError, match="authentication failed"):
            await endpoint.connect(server.listener, secret=WRONG_SECRET)
        good = await endpoint.connect(server.listener)
        await good.send([b"hello"])
        peer = await server.next_connection()
        assert bytes((await peer.receive())[0]) == b"hello"
        await good.aclose()
    assert "client failed to prove the shared secret" in caplog.text


async def test_stalled_handshake_is_cut_at_the_deadline(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "monarch.transport")
    async with serving(endpoint, handshake_timeout=0.3) as server:
        address = server.listener.address
        raw = await _raw_connect(address)
        with anyio.fail_after(5):
            # The server gives up and closes: our read sees EOF (or a reset).
            try:
                assert await raw.receive() == b""
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
        await raw.aclose()
        good = await endpoint.connect(server.listener)
        await good.aclose()
    assert "timed out" in caplog.text


async def test_handler_exception_is_logged_and_listener_survives(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "monarch.transport")
    calls = 0

    async def handler(conn):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("handler bug")
        await conn.send([b"fine"])
        await conn.receive()

    listener = await endpoint.listen()
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handler)
        first = await endpoint.connect(listener)
        with anyio.fail_after(5), pytest.raises(ConnectionClosed):
            await first.receive()
        second = await endpoint.connect(listener)
        assert bytes((await second.receive())[0]) == b"fine"
        await second.aclose()
        await first.aclose()
        tg.cancel_scope.cancel()
    await listener.aclose()
    assert "handler bug" in caplog.text


async def test_concurrent_receive_is_refused(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        await server.next_connection()
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.receive)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(anyio.BusyResourceError):
                await client.receive()
            tg.cancel_scope.cancel()
        await client.aclose()


async def test_receive_nowait_returns_frames_already_read(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        with pytest.raises(anyio.WouldBlock):
            push(peer).receive_nowait()
        for i in range(100):
            fast(client).send_nowait([str(i).encode()])
        await fast(client).flush()  # one small write: arrives in one read
        got = [bytes((await peer.receive())[0])]
        buffered = 0
        while len(got) < 100:
            try:
                got.append(bytes(push(peer).receive_nowait()[0]))
                buffered += 1
            except anyio.WouldBlock:
                got.append(bytes((await peer.receive())[0]))
        assert got == [str(i).encode() for i in range(100)]
        assert buffered > 0
        with pytest.raises(anyio.WouldBlock):
            push(peer).receive_nowait()
        await client.aclose()


async def test_connect_failures_are_connect_errors() -> None:
    with pytest.raises(ConnectError):
        await open_connection("unix:///nonexistent/dir/sock", secret=SECRET)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(ConnectError):
        await open_connection(f"tcp://127.0.0.1:{port}", secret=SECRET)


async def test_unknown_scheme_lists_installed_transports(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnknownTransportError, match=r"installed: .*tcp \(monarch-transport\)"):
        await open_connection("carrier-pigeon://x:1", secret=SECRET)
    # As without the monarch-rdma wheel (installed beside this one in the test env).
    found = {k: v for k, v in _registry._discover().items() if k != "ibverbs"}
    monkeypatch.setattr(plugin_group(_registry.ENTRY_POINT_GROUP), "_entries", found)
    loaded = {k: v for k, v in _registry._loaded.items() if k != "ibverbs"}
    monkeypatch.setattr(_registry, "_loaded", loaded)
    with pytest.raises(
        LookupError, match=r"install the monarch-rdma wheel .*pip install monarch-rdma"
    ):
        get_transport("ibverbs")
    assert {"unix", "tcp", "tls"} <= set(available_transports())


async def test_unix_path_listener_removes_its_file_and_replaces_stale_ones(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a crashed process leaves its socket file behind
    endpoint = Endpoint(f"unix://{path}")
    async with serving(endpoint) as server:
        conn = await endpoint.connect(server.listener)
        await conn.aclose()
    assert not path.exists()


async def test_tls_listener_without_context_is_refused() -> None:
    from monarch.transport import AddressError, open_listener

    with pytest.raises(AddressError, match="ssl_context"):
        await open_listener("tls://127.0.0.1:0", secret=SECRET)


async def _raw_connect(address: Address) -> anyio.abc.SocketStream:
    if address.scheme == "unix":
        path = address.host
        return await anyio.connect_unix("\0" + path[1:] if path.startswith("@") else path)
    assert address.port is not None
    return await anyio.connect_tcp(address.host, address.port)


async def test_tcp_transport_object_is_shared() -> None:
    assert get_transport("tcp") is get_transport("tcp")


def test_this_wheel_s_transports_are_its_entry_points() -> None:
    from monarch.transport._registry import BUILTIN

    ours = {
        ep.name: ep.value
        for ep in entry_points(group="monarch.transports")
        if ep.dist is not None and ep.dist.name == "monarch-transport"
    }
    assert ours == BUILTIN
    for scheme, value in BUILTIN.items():
        assert type(get_transport(scheme)).__name__ == value.rpartition(":")[2]


def test_a_process_listens_and_dials_without_reading_entry_points() -> None:
    """Every proc and client listens and dials as it starts: reading the installed
    distributions' entry points there would cost each ~25 ms."""
    code = (
        "import os, sys, anyio\n"
        "from monarch.transport import open_connection, open_listener\n"
        "async def main():\n"
        "    secret = os.urandom(32)\n"
        "    listener = await open_listener('unix://@', secret=secret)\n"
        "    async with anyio.create_task_group() as tg:\n"
        "        async def handle(conn):\n"
        "            pass\n"
        "        tg.start_soon(listener.serve, handle)\n"
        "        conn = await open_connection(listener.address, secret=secret)\n"
        "        await conn.aclose()\n"
        "        await listener.aclose()\n"
        "anyio.run(main)\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


async def test_malformed_frame_after_handshake_closes_with_log(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """An authenticated peer that sends a garbage header is cut off, others are not."""
    caplog.set_level(logging.WARNING, "monarch.transport")
    async with serving(endpoint, max_parts=8) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        raw = client.extra(ConnectionAttribute.raw_socket)
        raw.send(b"\xff\xff\xff\x7f garbage")  # claims 2**31 parts
        with pytest.raises(ProtocolError, match="max_parts=8"):
            await peer.receive()
        assert "max_parts=8" in caplog.text
        other = await endpoint.connect(server.listener)
        await other.aclose()
        await client.aclose()


async def test_flush_nowait_writes_what_the_socket_takes(endpoint: Endpoint) -> None:
    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        fast(client).send_nowait([b"small"])
        assert fast(client).flush_nowait()  # an idle socket takes a small frame at once
        assert bytes((await peer.receive())[0]) == b"small"
        big = bytearray(64 * 1024 * 1024)
        fast(client).send_nowait([big])
        assert not fast(client).flush_nowait()  # more than the socket buffers: the rest waits
        async with anyio.create_task_group() as tg:
            tg.start_soon(fast(client).flush)
            frame = await peer.receive()
        assert len(frame[0]) == len(big)
        await client.aclose()


async def test_a_thread_writing_while_the_connection_fails_gets_a_clean_error(
    endpoint: Endpoint,
) -> None:
    """A caller may write from its own thread (``send_nowait`` + ``flush_nowait``) while the
    event loop reads the same connection; a failed read then closes it under the writer."""
    import threading

    async with serving(endpoint) as server:
        client = await endpoint.connect(server.listener)
        peer = await server.next_connection()
        errors: list[BaseException] = []
        stop = threading.Event()

        def write() -> None:
            try:
                while not stop.is_set():
                    fast(client).send_nowait([b"x" * 100, b"y" * 5000])
                    fast(client).flush_nowait()
            except ConnectionClosed:
                pass
            except BaseException as exc:  # noqa: BLE001 - what the test looks for
                errors.append(exc)

        async def read_until_closed() -> None:
            while True:
                await client.receive()  # the read fails: the connection closes

        writer = threading.Thread(target=write)
        writer.start()
        try:
            await peer.receive()  # the writer is under way
            await peer.aclose()
            with pytest.raises(ConnectionClosed):
                await read_until_closed()
        finally:
            stop.set()
            await anyio.to_thread.run_sync(writer.join)
        assert errors == []
