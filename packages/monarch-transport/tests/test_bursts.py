"""Bursts of frames from several threads through one connection's fast path (hypothesis).

The runtime's writers queue a burst's frames and write them in as few ``sendmsg`` calls as
the socket allows, from whichever thread holds the connection. Whatever the burst sizes
and however the threads interleave, each sender's frames arrive whole and in its order;
when the peer dies mid-burst, every sender is told (``ConnectionClosed``), and what did
arrive is a prefix of what each sent.
"""

from __future__ import annotations

import threading
import time

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import Connection, ConnectionClosed

from .conftest import Endpoint, fast, serving  # type: ignore[import-not-found]

bursts = st.lists(st.lists(st.integers(0, 70_000), min_size=1, max_size=40), max_size=6)
"""One sender's bursts: each a list of frame sizes (some past a socket buffer)."""


def body(sender: int, index: int, size: int) -> bytes:
    """A frame's payload that names its sender and place, and checks its length."""
    return bytes([sender, index % 251]) * (size // 2) + bytes(size % 2)


def send_bursts(conn: Connection, sender: int, plan: list[list[int]], out: list[int]) -> None:
    """Send ``plan`` from this thread: a burst's frames queued back to back (written when
    the socket takes them), the last one waited for; ``out`` counts what was queued."""
    queue = fast(conn)
    index = 0
    for burst in plan:
        for i, size in enumerate(burst):
            last = i == len(burst) - 1
            header = b"%d:%d" % (sender, index)
            queue.send_threadsafe([header, body(sender, index, size)], 10.0 if last else 0.0)
            index += 1
            out[0] = index


def check_frame(frame: list[bytes], seen: dict[int, int]) -> None:
    """A frame is whole and the next one of its sender."""
    sender, index = (int(x) for x in frame[0].split(b":"))
    assert index == seen.get(sender, 0), f"sender {sender}: frame {index} out of order"
    payload = frame[1]
    assert payload == body(sender, index, len(payload))
    seen[sender] = index + 1


@settings(max_examples=15, deadline=None)
@given(
    plans=st.lists(bursts, min_size=1, max_size=4),
    backend=st.sampled_from(["asyncio", "trio"]),
    scheme=st.sampled_from(["unix://@", "tcp://127.0.0.1:0"]),
)
def test_frames_from_several_threads_arrive_whole_and_in_order(
    plans: list[list[list[int]]], backend: str, scheme: str
) -> None:
    expected = {s: sum(map(len, plan)) for s, plan in enumerate(plans) if plan}

    async def main() -> dict[int, int]:
        endpoint = Endpoint(scheme)
        async with serving(endpoint) as server:
            client = await endpoint.connect(server.listener)
            peer = await server.next_connection()
            seen: dict[int, int] = {}
            counts = [[0] for _ in plans]
            threads = [
                threading.Thread(target=send_bursts, args=(client, s, plan, counts[s]))
                for s, plan in enumerate(plans)
            ]
            for thread in threads:
                thread.start()
            with anyio.fail_after(60):
                for _ in range(sum(expected.values())):
                    check_frame([bytes(p) for p in await peer.receive()], seen)
                for thread in threads:
                    await anyio.to_thread.run_sync(thread.join)
            await client.aclose()
            return seen

    assert anyio.run(main, backend=backend) == expected


@settings(max_examples=8, deadline=None)
@given(
    senders=st.integers(1, 4),
    size=st.integers(0, 20_000),
    before=st.integers(1, 50),
    backend=st.sampled_from(["asyncio", "trio"]),
)
def test_a_peer_dying_mid_burst_is_reported_to_every_sender(
    senders: int, size: int, before: int, backend: str
) -> None:
    """Senders keep queueing bursts; the peer reads ``before`` frames and closes. Each
    sender then gets ``ConnectionClosed`` (never a hang or another error), and the frames
    the peer did read were whole and in each sender's order."""

    async def main() -> None:
        endpoint = Endpoint("unix://@")
        async with serving(endpoint) as server:
            client = await endpoint.connect(server.listener)
            peer = await server.next_connection()
            errors: list[BaseException | None] = [None] * senders
            stop_at = time.monotonic() + 30

            def send_until_closed(sender: int) -> None:
                plan = [[size] * 16]
                try:
                    while time.monotonic() < stop_at:
                        send_bursts(client, sender, plan, [0])
                except BaseException as exc:  # noqa: BLE001 - what the test looks for
                    errors[sender] = exc

            threads = [
                threading.Thread(target=send_until_closed, args=(s,)) for s in range(senders)
            ]
            for thread in threads:
                thread.start()
            last: dict[int, int] = {}
            with anyio.fail_after(30):
                for _ in range(before):
                    frame = [bytes(p) for p in await peer.receive()]
                    sender, index = (int(x) for x in frame[0].split(b":"))
                    # A sender numbers each burst of 16 from 0.
                    assert index == (last.get(sender, -1) + 1) % 16
                    assert frame[1] == body(sender, index, len(frame[1]))
                    last[sender] = index
                await peer.aclose()
                for thread in threads:
                    await anyio.to_thread.run_sync(thread.join)
            assert all(isinstance(e, ConnectionClosed) for e in errors), errors
            await client.aclose()

    anyio.run(main, backend=backend)
