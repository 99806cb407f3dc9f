"""Messages on the wire: a small one travels as one ``Packed`` part, those queued
together for one peer as one ``Batch``, and what a peer sends that does not decode
closes only that peer's connection."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.core import current_runtime
from monarch.core._bulk._lending import available as lending_available
from monarch.core._config import current_config
from monarch.core._runtime import DEFER
from monarch.core._runtime._messages import (
    BATCH_BYTES,
    BATCH_MAX,
    PACK_MAX,
    TO_PROC,
    Batch,
    Beat,
    Call,
    Envelope,
    Hello,
    Packed,
    PortRef,
    PortValue,
    Relay,
    ReturnLoans,
    ShapeSpec,
    SpawnActor,
    StopProc,
    ZygoteExited,
    ZygoteFork,
    ZygoteForked,
    ZygotePreload,
    ZygoteReady,
    decode_beat,
    decode_body,
    decode_envelope,
    decode_single,
    decode_zygote,
    encode,
    encode_body,
)
from monarch.transport import Connection, ConnectionClosed, open_connection, open_listener

names = st.text(max_size=20)
seqs = st.lists(st.integers(0, 2**63 - 1), max_size=4).map(tuple)
shapes = st.builds(
    ShapeSpec,
    st.lists(names, max_size=2).map(tuple),
    st.integers(0, 9),
    st.just(()),
    st.just(()),
)
ports = st.builds(PortRef, names, st.integers(0, 2**32))
ranks = st.lists(st.integers(0, 2**31), min_size=1, max_size=3).map(tuple)
calls = st.builds(
    Call,
    names,
    names,
    shapes,
    st.none() | ports,
    st.booleans(),
    names,
    seqs,
    st.lists(names, max_size=3).map(tuple),
    st.booleans(),
)
spawns = st.builds(
    SpawnActor, names, names, st.integers(0, 2**31), shapes, ports, ranks, names, st.none() | ports
)
relays = st.builds(  # a host agent's spawn or stop for its procs (``_host._watching``)
    Relay,
    st.lists(names, max_size=3).map(tuple),
    spawns | st.builds(StopProc, names),
    st.lists(ranks, max_size=3).map(tuple),
)
bodies = (
    calls
    | st.builds(PortValue, st.integers(0, 2**31), st.booleans())
    | st.builds(ReturnLoans, seqs)
    | spawns
    | relays
)
envelopes = st.builds(Envelope, st.integers(0, 9), names, names)


@given(spawns, ranks, st.none() | ports)
def test_a_spawn_for_a_process_names_its_first_rank_and_all_of_them_if_several(
    spawn: SpawnActor, hosted: tuple[int, ...], ack: PortRef | None
) -> None:
    # One rule for the spawner's own spawns and its host agents' (``Relay``).
    each = spawn.for_ranks(list(hosted), ack)
    assert each.rank == hosted[0]
    assert (each.ranks or (each.rank,)) == hosted
    assert each.ack == (ack or spawn.ack)
    assert (each.mesh, each.name, each.shape, each.reply, each.owner) == (
        spawn.mesh,
        spawn.name,
        spawn.shape,
        spawn.reply,
        spawn.owner,
    )
    assert decode_body(encode(each)) == each


@given(envelopes, bodies, st.lists(st.binary(max_size=PACK_MAX), max_size=1).map(tuple))
def test_packed_round_trips(envelope: Envelope, body: object, payload: tuple[bytes, ...]) -> None:
    packed = Packed(envelope, body, payload)  # type: ignore[arg-type]
    back = decode_single(memoryview(encode(packed)))
    assert back == packed
    assert isinstance(back, Packed)
    assert all(type(part) is bytes for part in back.payload)


@given(st.lists(st.builds(Packed, envelopes, bodies, st.just((b"p",))), min_size=1, max_size=5))
def test_a_batch_round_trips(items: list[Packed]) -> None:
    assert decode_single(encode(Batch(items))) == Batch(items)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.sampled_from([0, 1, 200, PACK_MAX, PACK_MAX + 1, 50_000]), min_size=1, max_size=700)
)
def test_messages_queued_together_travel_as_batches_in_order(sizes: list[int]) -> None:
    """A burst to one peer (posted off the loop, left to the writer task): the small
    messages of each run between large ones arrive as Batch frames, as full as the
    limits allow, and every message arrives once, in order, with its payload."""
    runtime = current_runtime()
    frames: list[list[bytes]] = []

    async def main() -> None:
        async with await open_listener("unix://@", secret=runtime.secret) as listener:
            done = anyio.Event()

            async def handler(conn: Connection) -> None:
                seen = -1  # the hello is not a message
                async for frame in conn:
                    frames.append([bytes(part) for part in frame])
                    head = decode_single(frame[0]) if len(frame) == 1 else None
                    seen += len(head.items) if isinstance(head, Batch) else 1
                    if seen == len(sizes):
                        done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, handler)
                # Posted before the connection can be accepted (this thread's loop is
                # busy posting): all wait in the writer's queue together.
                for i, size in enumerate(sizes):
                    payload = [b"x" * size] if size else []
                    runtime.post(str(listener.address), TO_PROC, "", PortValue(i), payload, DEFER)
                with anyio.fail_after(30):
                    await done.wait()
                tg.cancel_scope.cancel()

    anyio.run(main)
    hello = decode_single(frames[0][0])
    assert isinstance(hello, Hello) and hello.sender == runtime.address and not hello.lane
    arrived: list[tuple[int, int]] = []  # (rank, payload size) of each message
    runs: list[list[Packed]] = []  # the small messages of each frame ([] for a large one)
    for frame in frames[1:]:
        if len(frame) > 1:
            assert decode_envelope(frame[0]).kind == TO_PROC
            arrived.append((_rank(decode_body(frame[1])), sum(map(len, frame[2:]))))
            runs.append([])
            continue
        head = decode_single(frame[0])
        if isinstance(head, Batch):
            assert len(head.items) > 1  # never a Batch of one
            items = head.items
        else:
            assert isinstance(head, Packed)
            items = [head]
        runs.append(items)
        arrived += [(_rank(item.body), sum(map(len, item.payload))) for item in items]
    assert arrived == list(enumerate(sizes))
    for run, following in zip(runs, [*runs[1:], []], strict=True):
        size = sum(len(part) for item in run for part in item.payload)
        assert len(run) <= BATCH_MAX and size < BATCH_BYTES + PACK_MAX
        if run and following:  # split only where a limit was reached
            assert len(run) == BATCH_MAX or size >= BATCH_BYTES


def test_a_full_run_is_written_by_the_thread_that_filled_it() -> None:
    """With the runtime's loop busy (its writer task cannot run), a burst still reaches
    the peer a full Batch at a time, written by the posting thread; the rest waits for
    the writer task."""
    runtime = current_runtime()
    arrived: list[int] = []

    async def main() -> None:
        async with await open_listener("unix://@", secret=runtime.secret) as listener:
            send, receive = anyio.create_memory_object_stream[int](10_000)

            async def handler(conn: Connection) -> None:
                async for frame in conn:
                    head = decode_single(frame[0])
                    for item in head.items if isinstance(head, Batch) else [head]:
                        if isinstance(item, Packed):
                            await send.send(_rank(item.body))

            async def take(count: int) -> None:
                with anyio.fail_after(10):
                    for _ in range(count):
                        arrived.append(await receive.receive())

            address = str(listener.address)
            async with anyio.create_task_group() as tg:
                tg.start_soon(listener.serve, handler)
                runtime.post(address, TO_PROC, "", PortValue(0), (), None)  # connects
                await take(1)
                inside, release = threading.Event(), threading.Event()

                def busy() -> None:
                    inside.set()
                    release.wait(30)

                runtime.call_soon(busy)
                assert inside.wait(10)
                try:
                    for rank in range(1, 2 * BATCH_MAX + 6):
                        runtime.post(address, TO_PROC, "", PortValue(rank), (), DEFER)
                    await take(2 * BATCH_MAX)  # two full runs, the loop still busy
                finally:
                    release.set()
                await take(5)  # the rest, by the writer task
                tg.cancel_scope.cancel()

    anyio.run(main)
    assert arrived == list(range(2 * BATCH_MAX + 6))


def _rank(body: object) -> int:
    assert isinstance(body, PortValue)
    return body.rank


hellos = st.builds(
    Hello,
    names,
    names,
    st.floats(0, 1e6),
    st.booleans(),
    st.integers(0, 2**31),
    st.integers(0, 2**63 - 1),
    names,
)


zygote_messages = (  # an agent and its zygote, a zygote and its successor (``_zygote_proc``)
    st.builds(
        ZygoteFork,
        st.integers(0, 2**63 - 1),
        st.dictionaries(names, names, max_size=4),
        names,
        st.lists(names, max_size=3).map(tuple),
    )
    | st.builds(ZygoteForked, st.integers(0, 2**63 - 1), st.integers(0, 2**31), names)
    | st.builds(ZygoteExited, st.integers(0, 2**31), st.integers(-64, 255))
    | st.builds(ZygoteReady, names)
    | st.builds(ZygotePreload, st.lists(names, max_size=4).map(tuple))
)


@given(zygote_messages)
def test_a_zygotes_messages_round_trip(message: object) -> None:
    assert decode_zygote(encode_body(message)) == message


@given(hellos)
def test_a_hello_is_told_apart_from_a_packed_message(hello: Hello) -> None:
    assert decode_single(encode(hello)) == hello


@given(st.builds(Beat, names, st.booleans(), st.booleans()))
def test_beats_round_trip(beat: Beat) -> None:
    assert decode_beat(encode(beat)) == beat


@given(envelopes)
def test_envelopes_round_trip(envelope: Envelope) -> None:
    assert decode_envelope(encode(envelope)) == envelope


class Pinger(Actor):
    @endpoint
    def ping(self, x: bytes) -> bytes:
        return x

    @endpoint
    def address(self) -> str:
        return current_runtime().address


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    yield mesh
    mesh.stop().get(timeout=30)


GARBAGE = [
    [b"\x93\x01garbage"],  # not msgpack a single part may hold
    [encode(Envelope(1, "x", "y")), b"\xc1", b"\x80\x05N."],  # a body that does not decode
    [encode(Packed(Envelope(1, "x", "y"), PortValue(0), ())) + b"\x00"],  # trailing
]


@pytest.mark.parametrize("frame", GARBAGE, ids=["single", "body", "trailing"])
def test_a_malformed_message_closes_only_its_connection(
    procs: ProcMesh, frame: list[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    pinger = procs.spawn("pinger", Pinger)
    runtime = current_runtime()

    async def send_garbage() -> None:
        async with await open_connection(runtime.address, secret=runtime.secret) as conn:
            await conn.send(frame)
            with anyio.fail_after(10), pytest.raises(ConnectionClosed):
                await conn.receive()  # the runtime closes the connection

    with caplog.at_level(logging.WARNING, logger="monarch.core"):
        anyio.run(send_garbage)
    assert "malformed message" in caplog.text
    # Replies reach this process's runtime on other connections: it still serves them.
    assert pinger.ping.call_one(b"x" * (PACK_MAX + 1)).get(timeout=30) == b"x" * (PACK_MAX + 1)
    assert pinger.ping.call_one(b"small").get(timeout=30) == b"small"


def test_a_peer_on_this_machine_says_in_its_beat_that_it_reads_our_memory(
    procs: ProcMesh,
) -> None:
    """Our hello carries where the peer may probe our memory; a proc of this machine
    answers with ``Beat(pull=True)``, and our writer then lends it large buffers."""
    if not lending_available() or not current_config().read_peer_buffers:
        pytest.skip("no reading of peer memory here")
    pinger = procs.spawn("lender", Pinger)
    address = pinger.address.call_one().get(timeout=30)
    writer = current_runtime()._writers[address]
    deadline = time.monotonic() + 30
    while not writer.lend:  # the Beat is read by the writer's watch task
        assert time.monotonic() < deadline, "no Beat(pull=True) from the proc"
        time.sleep(0.01)
    big = os.urandom(4 * 1024 * 1024)
    assert pinger.ping.call_one(big).get(timeout=30) == big
