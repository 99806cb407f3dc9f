"""Run in the soft-RoCE VM: the ibverbs transport's limits over real verbs.

- the receiver's queue pair (the connection's plane, ``_link``) reaches what was lent to
  it and nothing else: a read past the offered range, and a read of an ``RDMABuffer``'s
  region (another protection domain) with its real rkey, are refused by the NIC;
- a sender that died before its part was read fails the connection with a logged reason,
  not a hang;
- an end with ``rdma_disable_ibverbs`` makes the connection plain TCP, data equal.

``python transport_faults.py`` runs it all (children are this script with an argument);
prints TRANSPORT-FAULTS-OK.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import anyio

from monarch.config import configure
from monarch.core import buffer_address
from monarch.rdma import RDMABuffer
from monarch.rdma import _verbs as verbs
from monarch.rdma._link import lent_part
from monarch.rdma._transport import IbverbsConnection, _decode_control
from monarch.transport import Connection, TransportError, open_connection, open_listener

SECRET = bytes(range(32))
MIB = 1024 * 1024
HOST = "10.9.0.1"


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _read(conn: IbverbsConnection, local: bytearray, size: int, address: int, rkey: int) -> None:
    """Read through the connection's plane as the receiver does, whatever was lent."""
    conn._plane.read(
        lent_part(0, address, size, rkey), buffer_address(local), time.monotonic() + 60
    )


async def _attempt(
    server: IbverbsConnection, local: bytearray, size: int, address: int, rkey: int
) -> Exception | None:
    """A read over the server's link: None, or why the NIC refused it."""
    try:
        await anyio.to_thread.run_sync(_read, server, local, size, address, rkey)
    except Exception as error:  # noqa: BLE001 - the refusal is the outcome
        return error
    return None


async def only_what_was_offered() -> None:
    data = os.urandom(2 * MIB)
    other = bytearray(os.urandom(MIB))
    theirs = RDMABuffer(other)  # registered in the device's own domain, with its rkey
    for attempt in ("past the range", "another domain", "the offer itself"):
        await one_attempt(attempt, data, theirs)
    theirs.drop().get()


async def one_attempt(attempt: str, data: bytes, theirs: RDMABuffer) -> None:
    """Offer ``data``; the server's end then reads what ``attempt`` names."""
    received: list[tuple[IbverbsConnection, list[memoryview]]] = []
    arrived = anyio.Event()

    async def take(conn: Connection) -> None:
        assert isinstance(conn, IbverbsConnection), conn
        received.append((conn, await conn._inner.receive()))  # the raw frame: its offer
        arrived.set()
        await anyio.sleep_forever()

    listener = await open_listener(f"ibverbs://{HOST}:0", secret=SECRET)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, take)
        async with await open_connection(listener.address, secret=SECRET) as conn:
            await conn.send([b"head", data])
            with anyio.fail_after(60):
                await arrived.wait()
            server, frame = received[0]
            offer = _decode_control(frame[0])
            ((index, _key, address, rkey, length),) = offer.parts
            assert index == 1 and length == len(data)
            local = bytearray(length + 4096)
            if attempt == "past the range":
                refused = await _attempt(server, local, length + 4096, address, rkey)
            elif attempt == "another domain":
                handle = theirs._handle
                reach = handle.reach("ibverbs")
                assert reach is not None
                refused = await _attempt(server, local, handle.size, handle.address, reach[0])
            else:
                assert await _attempt(server, local, length, address, rkey) is None
                assert bytes(local[:length]) == data
                print("ok: the offered range itself is read", flush=True)
                refused = None
            if attempt != "the offer itself":
                assert refused is not None, f"{attempt} was read"
                print(f"ok: a read of {attempt} refused by the NIC: {refused}", flush=True)
        tg.cancel_scope.cancel()


async def a_dead_sender_fails_the_connection() -> None:
    recorder = Recorder()
    logging.getLogger("monarch.rdma").addHandler(recorder)
    outcome: list[BaseException | None] = []
    arrived, died, ended = anyio.Event(), anyio.Event(), anyio.Event()

    async def take(conn: Connection) -> None:
        assert isinstance(conn, IbverbsConnection), conn
        arrived.set()
        await died.wait()  # the sender is dead before we read its part
        try:
            with anyio.fail_after(120):
                await conn.receive()
            outcome.append(None)
        except TransportError as error:
            outcome.append(error)
        ended.set()

    listener = await open_listener(f"ibverbs://{HOST}:0", secret=SECRET)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, take)
        child = await anyio.open_process([sys.executable, __file__, "die", str(listener.address)])
        with anyio.fail_after(300):
            await arrived.wait()
            code = await child.wait()
        assert code == -signal.SIGKILL, code
        died.set()
        with anyio.fail_after(180):
            await ended.wait()
        tg.cancel_scope.cancel()
    error = outcome[0]
    assert error is not None, "a dead sender's part was read"
    logged = [m for m in recorder.messages if "RDMA read of an offered" in m]
    assert logged, recorder.messages
    print(f"ok: a dead sender fails the connection: {error}; logged: {logged[0]}", flush=True)


async def disabled_end_is_plain_tcp() -> None:
    kinds: list[str] = []
    got: list[bytes] = []
    arrived = anyio.Event()

    async def take(conn: Connection) -> None:
        kinds.append(type(conn).__name__)
        frame = await conn.receive()
        got.append(bytes(frame[1]))
        arrived.set()

    listener = await open_listener(f"ibverbs://{HOST}:0", secret=SECRET)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, take)
        await anyio.run_process(
            [sys.executable, __file__, "disabled", str(listener.address)],
            env={**os.environ, "MONARCH_RDMA_DISABLE_IBVERBS": "1"},
            stdout=None,
            stderr=None,
        )
        with anyio.fail_after(60):
            await arrived.wait()
        tg.cancel_scope.cancel()
    assert kinds == ["SocketConnection"], kinds
    assert got == [bytes(range(256)) * 8192]
    print("ok: an end with rdma_disable_ibverbs makes the connection plain TCP", flush=True)


async def child(mode: str, address: str) -> None:
    conn = await open_connection(address, secret=SECRET)
    if mode == "die":
        assert isinstance(conn, IbverbsConnection)
        await conn.send([b"head", os.urandom(16 * MIB)])
        os.kill(os.getpid(), signal.SIGKILL)
    assert not isinstance(conn, IbverbsConnection)
    await conn.send([b"head", bytes(range(256)) * 8192])
    await conn.aclose()


def main() -> int:
    if len(sys.argv) > 1:
        anyio.run(child, sys.argv[1], sys.argv[2])
        return 0
    configure(read_peer_buffers=False)
    assert verbs.device() is not None, "no ibverbs device"
    anyio.run(only_what_was_offered)
    anyio.run(a_dead_sender_fails_the_connection)
    anyio.run(disabled_end_is_plain_tcp)
    print("TRANSPORT-FAULTS-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
