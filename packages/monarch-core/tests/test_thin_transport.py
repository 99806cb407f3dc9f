"""The runtime over a transport that offers only the thin contract (``send``, ``receive``,
``aclose``): its writers use ``SendQueue`` for the fast path it lacks, its readers take one
frame per ``receive``, and heartbeats still go out from their thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from monarch.core import current_runtime
from monarch.core._config import current_config
from monarch.core._runtime._messages import (
    TO_PORT,
    TO_PROC,
    Batch,
    Beat,
    Envelope,
    Hello,
    Packed,
    PortValue,
    decode_beat,
    decode_body,
    decode_envelope,
    decode_single,
    encode,
)
from monarch.core._runtime._sendqueue import SendQueue, frame_queue
from monarch.transport import (
    Buffer,
    Connection,
    ConnectionAttribute,
    ConnectionClosed,
    Listener,
    open_connection,
    open_listener,
    register_transport,
)
from monarch.transport.testing import Thin, ThinTransport


@pytest.fixture(scope="module", autouse=True)
def thin() -> None:
    register_transport(ThinTransport())


def test_the_queue_falls_back_to_send_where_no_fast_path_is_offered() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        secret = b"s" * 32
        async with await open_listener("tcp://127.0.0.1:0", secret=secret) as listener:
            got: list[list[bytes]] = []
            done = asyncio.Event()

            async def handler(conn: Connection) -> None:
                async for frame in conn:
                    got.append([bytes(part) for part in frame])
                    if len(got) == 12:
                        done.set()

            serving = loop.create_task(listener.serve(handler))
            port = listener.address.port
            real = await open_connection(f"tcp://127.0.0.1:{port}", secret=secret)
            assert frame_queue(real, loop) is real.extra(ConnectionAttribute.frame_queue)
            await real.aclose()
            conn = await open_connection(f"thin://127.0.0.1:{port}", secret=secret)
            queue = frame_queue(conn, loop)
            assert isinstance(queue, SendQueue)
            for i in range(10):
                queue.send_nowait([b"n", str(i).encode(), b"x" * (i * 10_000)])
            assert not queue.flush_nowait()  # only the loop writes
            assert queue.unsent == sum(1 + len(str(i)) + i * 10_000 for i in range(10))
            await queue.flush()
            assert queue.unsent == 0 and queue.flush_nowait()
            thread = threading.Thread(target=queue.send_threadsafe, args=([b"thread"],))
            thread.start()
            await asyncio.to_thread(thread.join)
            await conn.send([b"last"])  # behind the thread's frame: the loop has it
            await asyncio.wait_for(done.wait(), 30)
            assert got[10:] == [[b"thread"], [b"last"]]
            assert got[:10] == [[b"n", str(i).encode(), b"x" * (i * 10_000)] for i in range(10)]
            await conn.aclose()
            queue.send_nowait([b"after close"])
            with pytest.raises(ConnectionClosed):
                await queue.flush()
            serving.cancel()

    asyncio.run(main())


def test_a_writer_speaks_to_a_peer_over_the_thin_contract() -> None:
    """Messages posted from the loop and from other threads, small and large, reach a
    peer reached through ``thin://`` in order, after a hello that names the heartbeat
    interval in its own field."""
    runtime = current_runtime()
    frames: list[list[bytes]] = []
    count = 300

    async def main() -> None:
        async with await open_listener("tcp://127.0.0.1:0", secret=runtime.secret) as listener:
            done = anyio.Event()

            async def handler(conn: Connection) -> None:
                async for frame in conn:
                    frames.append([bytes(part) for part in frame])
                    if len(frames) > 1 and _ranks(frames[-1])[-1] == count - 1:
                        done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, handler)
                address = f"thin://127.0.0.1:{listener.address.port}"
                for i in range(count):
                    payload = [b"p" * (100_000 if i % 50 == 3 else 10)]
                    runtime.post(address, TO_PROC, "", PortValue(i), payload, on_loop=False)
                with anyio.fail_after(30):
                    await done.wait()
                tg.cancel_scope.cancel()

    anyio.run(main)
    hello = decode_single(frames[0][0])
    assert isinstance(hello, Hello)
    assert hello.sender == runtime.address and hello.incarnation == runtime.incarnation
    assert hello.heartbeat_interval == current_config().heartbeat_interval
    assert [rank for frame in frames[1:] for rank in _ranks(frame)] == list(range(count))


def _ranks(frame: list[bytes]) -> list[int]:
    """The ranks of the messages a frame holds (a ``Packed``, a ``Batch``, or parts)."""
    if len(frame) == 1:
        head = decode_single(frame[0])
        items = head.items if isinstance(head, Batch) else [head]
        bodies = [item.body for item in items if isinstance(item, Packed)]
        assert len(bodies) == len(items)
    else:
        assert decode_envelope(frame[0]).kind == TO_PROC
        bodies = [decode_body(frame[1])]
    ranks = [body.rank for body in bodies if isinstance(body, PortValue)]
    assert len(ranks) == len(bodies)
    return ranks


def test_a_reader_serves_a_peer_over_the_thin_contract() -> None:
    """A connection with neither fast path nor push mode, handed to the runtime's reader:
    the hello is answered, beats come at the interval the hello asked for (sent from the
    heartbeat thread through ``SendQueue``), and messages reach their port."""
    runtime = current_runtime()
    values: list[int] = []
    arrived = threading.Event()

    def on_value(body: object, payload: Sequence[Buffer]) -> None:
        assert isinstance(body, PortValue)
        values.append(body.rank)
        if len(values) == 3:
            arrived.set()

    port = runtime.open_port(on_value)
    listener = asyncio.run_coroutine_threadsafe(_listen_thin(runtime), runtime.loop).result(10)

    async def peer() -> list[Beat]:
        beats: list[Beat] = []
        address = str(listener.address)
        async with await open_connection(address, secret=runtime.secret) as conn:
            hello = Hello("tcp://127.0.0.1:9", "peer-incarnation", heartbeat_interval=0.02)
            await conn.send([encode(hello)])
            for i in range(3):
                envelope = Envelope(TO_PORT, str(port.port), hello.sender)
                await conn.send([encode(Packed(envelope, PortValue(i)))])
            with anyio.fail_after(30):
                while len(beats) < 4:  # the answer, then heartbeats
                    beats.append(decode_beat((await conn.receive())[0]))
        return beats

    try:
        beats = anyio.run(peer)
        assert arrived.wait(30)
        assert values == [0, 1, 2]
        assert beats[0].incarnation == runtime.incarnation
        assert all(beat == Beat() for beat in beats[1:])
    finally:
        runtime.close_port(port)
        asyncio.run_coroutine_threadsafe(listener.aclose(), runtime.loop).result(10)


async def _listen_thin(runtime: Any) -> Listener:
    """A listener on the runtime's loop that hands its reader ``Thin`` connections."""
    listener = await open_listener("tcp://127.0.0.1:0", secret=runtime.secret)

    async def handler(conn: Connection) -> None:
        await runtime._serve_connection(Thin(conn))

    runtime.spawn_task(listener.serve(handler))
    return listener
