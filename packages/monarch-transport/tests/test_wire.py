"""Wire schema: round trips, tags, and the forward/backward compatibility rules."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.transport import wire

text = st.text(max_size=40)

rejects = st.builds(wire.Reject, text, st.integers(0, 10))
handshakes = st.one_of(
    st.builds(
        wire.ClientHello, st.integers(0, 2**16), st.integers(0, 2**16), st.binary(max_size=64)
    ),
    st.builds(wire.ServerHello, st.integers(0, 2**16), st.binary(max_size=64)),
    st.builds(wire.Proof, st.binary(max_size=64), st.integers(0, 2**16)),
    st.builds(wire.Accept),
    rejects,
)


@given(handshakes)
def test_handshake_messages_round_trip_through_the_tagged_union(message: msgspec.Struct) -> None:
    decoded = wire.decode_handshake(wire.encode(message))
    assert decoded == message and type(decoded) is type(message)


def test_structs_are_arrays_led_by_an_integer_tag() -> None:
    assert msgspec.msgpack.decode(wire.encode(wire.Proof(b"m", 1))) == [3, b"m", 1]
    assert msgspec.msgpack.decode(wire.encode(wire.Reject("r", 2))) == [5, "r", 2]


class RejectV2(msgspec.Struct, array_like=True, tag=5, frozen=True):
    """What a later release may send: the same fields, one more appended with a default."""

    reason: str
    code: int = 0
    retry_after: float = 0.0


@given(rejects, st.floats(0, 60))
def test_old_decoder_reads_newer_messages(reject: wire.Reject, retry_after: float) -> None:
    newer = RejectV2(reject.reason, reject.code, retry_after)
    assert wire.decode_handshake(msgspec.msgpack.encode(newer)) == reject


@given(rejects)
def test_newer_decoder_reads_old_messages(reject: wire.Reject) -> None:
    decoded = msgspec.msgpack.decode(wire.encode(reject), type=RejectV2)
    assert decoded.retry_after == 0.0 and decoded.reason == reject.reason


def test_garbage_is_a_decode_error_not_a_crash() -> None:
    with pytest.raises(msgspec.DecodeError):
        wire.decode_handshake(b"\x93\x63\x00\x00")
    with pytest.raises(msgspec.DecodeError):
        wire.decode_gateway_request(wire.encode(wire.Accept()))
