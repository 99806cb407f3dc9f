"""The ``ibverbs`` transport where there is no device (this machine): plain TCP, no change
to user code. Its RDMA path runs in the soft-RoCE VM (``test_verbs_vm``)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from monarch.config import configured
from monarch.core import current_config, listen_address
from monarch.rdma import is_ibverbs_available
from monarch.rdma._transport import IbverbsConnection, IbverbsTransport, transport_stats
from monarch.transport import (
    ConnectionAttribute,
    HandshakeError,
    get_transport,
    open_connection,
    open_listener,
)

pytestmark = pytest.mark.skipif(
    is_ibverbs_available(), reason="a device is here: the fallback is not what runs"
)

HERE = Path(__file__).resolve().parent
SECRET = secrets.token_bytes(32)
MIB = 1024 * 1024


def test_the_entry_point_is_the_ibverbs_transport() -> None:
    assert isinstance(get_transport("ibverbs"), IbverbsTransport)


def test_default_transport_ibverbs_listens_on_every_interface() -> None:
    with configured(default_transport="ibverbs"):
        assert current_config().default_transport == "ibverbs"
        assert listen_address() == "ibverbs://0.0.0.0:0"
    with configured(default_transport="ibverbs://127.0.0.1:0"):
        assert listen_address() == "ibverbs://127.0.0.1:0"


@pytest.mark.anyio
async def test_without_a_device_frames_go_by_plain_tcp() -> None:
    large = os.urandom(3 * MIB + 1)
    before = transport_stats()

    async def echo(conn: object) -> None:
        async for frame in conn:  # type: ignore[attr-defined]
            await conn.send(frame)  # type: ignore[attr-defined]

    async with await open_listener("ibverbs://127.0.0.1:0", secret=SECRET) as listener:
        assert str(listener.address).startswith("ibverbs://127.0.0.1:")
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, echo)
            async with await open_connection(listener.address, secret=SECRET) as conn:
                assert not isinstance(conn, IbverbsConnection)  # the TCP connection itself
                assert conn.extra(ConnectionAttribute.transport) == "ibverbs"
                await conn.send([b"head", large, bytearray(b"tail")])
                back = await conn.receive()
                assert [bytes(p) for p in back] == [b"head", large, b"tail"]
            tg.cancel_scope.cancel()
    assert transport_stats() == before


@pytest.mark.anyio
async def test_a_listener_that_says_no_hello_is_refused_clearly() -> None:
    async def silent(conn: object) -> None:
        await anyio.sleep_forever()

    listener = await open_listener("tcp://127.0.0.1:0", secret=SECRET)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, silent)
        port = listener.address.port
        with pytest.raises(HandshakeError, match="no ibverbs hello"):
            await open_connection(
                f"ibverbs://127.0.0.1:{port}", secret=SECRET, handshake_timeout=0.5
            )
        tg.cancel_scope.cancel()


@pytest.mark.timeout(180)
def test_a_job_over_ibverbs_without_a_device_falls_back_to_tcp() -> None:
    """Actor calls with large bytes and tensors, client to procs and proc to proc."""
    pytest.importorskip("torch")
    job = subprocess.run(
        [sys.executable, str(HERE / "rdma_transport_job.py"), "tcp"],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=HERE,
    )
    assert "TRANSPORT-JOB-OK" in job.stdout, job.stdout[-3000:] + job.stderr[-3000:]
    assert "every part went by TCP" in job.stdout


def test_buffers_of_a_runtime_on_ibverbs_are_served_on_its_host() -> None:
    """The TCP plane's data server listens where the runtime does (not loopback)."""
    from monarch.rdma._process import _tcp_host

    assert _tcp_host("ibverbs://10.1.2.3:4000") == "10.1.2.3"
