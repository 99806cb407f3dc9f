"""Messages on the wire: a small one travels as one ``Packed`` part, and what a peer
sends that does not decode closes only that peer's connection."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.core._messages import (
    PACK_MAX,
    Call,
    Packed,
    PortRef,
    PortValue,
    ReturnLoans,
    ShapeSpec,
    decode_single,
)
from monarch.core._runtime import current_runtime
from monarch.transport import ConnectionClosed, open_connection
from monarch.transport.wire import Envelope, encode

names = st.text(max_size=20)
seqs = st.lists(st.integers(0, 2**63 - 1), max_size=4).map(tuple)
calls = st.builds(
    Call,
    names,
    names,
    st.builds(
        ShapeSpec,
        st.lists(names, max_size=2).map(tuple),
        st.integers(0, 9),
        st.just(()),
        st.just(()),
    ),
    st.none() | st.builds(PortRef, names, st.integers(0, 2**32)),
    st.booleans(),
    names,
    seqs,
    st.lists(names, max_size=3).map(tuple),
    st.booleans(),
)
bodies = (
    calls
    | st.builds(PortValue, st.integers(0, 2**31), st.booleans())
    | st.builds(ReturnLoans, seqs)
)
envelopes = st.builds(Envelope, st.integers(0, 9), names, names)


@given(envelopes, bodies, st.lists(st.binary(max_size=PACK_MAX), max_size=1).map(tuple))
def test_packed_round_trips(envelope: Envelope, body: object, payload: tuple[bytes, ...]) -> None:
    packed = Packed(envelope, body, payload)  # type: ignore[arg-type]
    back = decode_single(memoryview(encode(packed)))
    assert back == packed
    assert isinstance(back, Packed)
    assert all(type(part) is bytes for part in back.payload)


@given(envelopes)
def test_a_lone_envelope_is_told_apart_from_a_packed_message(envelope: Envelope) -> None:
    assert decode_single(encode(envelope)) == envelope


class Pinger(Actor):
    @endpoint
    def ping(self, x: bytes) -> bytes:
        return x


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
