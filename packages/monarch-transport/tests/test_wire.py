"""Wire schema: round trips, tags, and the forward/backward compatibility rules."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.transport import wire

text = st.text(max_size=40)

envelopes = st.builds(
    wire.Envelope,
    kind=st.integers(0, 2**32),
    dest=text,
    sender=text,
    seq=st.integers(0, 2**63 - 1),
    headers=st.dictionaries(text, text, max_size=4),
)
handshakes = st.one_of(
    st.builds(
        wire.ClientHello, st.integers(0, 2**16), st.integers(0, 2**16), st.binary(max_size=64)
    ),
    st.builds(wire.ServerHello, st.integers(0, 2**16), st.binary(max_size=64)),
    st.builds(wire.Proof, st.binary(max_size=64), st.integers(0, 2**16)),
    st.builds(wire.Accept),
    st.builds(wire.Reject, text, st.integers(0, 10)),
)


@given(envelopes)
def test_envelope_round_trip(envelope: wire.Envelope) -> None:
    assert wire.decode_envelope(wire.encode(envelope)) == envelope


@given(handshakes)
def test_handshake_messages_round_trip_through_the_tagged_union(message: msgspec.Struct) -> None:
    decoded = wire.decode_handshake(wire.encode(message))
    assert decoded == message and type(decoded) is type(message)


def test_structs_are_arrays_led_by_an_integer_tag() -> None:
    assert msgspec.msgpack.decode(wire.encode(wire.Proof(b"m", 1))) == [3, b"m", 1]
    assert msgspec.msgpack.decode(wire.encode(wire.Envelope(7, "d", "s")))[:4] == [16, 7, "d", "s"]


class EnvelopeV2(msgspec.Struct, array_like=True, tag=16, frozen=True):
    """What a later release may send: the same fields, one more appended with a default."""

    kind: int
    dest: str
    sender: str
    seq: int = 0
    headers: dict[str, str] = {}
    priority: int = 0


@given(envelopes, st.integers(0, 9))
def test_old_decoder_reads_newer_envelopes(envelope: wire.Envelope, priority: int) -> None:
    newer = EnvelopeV2(
        envelope.kind, envelope.dest, envelope.sender, envelope.seq, envelope.headers, priority
    )
    assert wire.decode_envelope(msgspec.msgpack.encode(newer)) == envelope


@given(envelopes)
def test_newer_decoder_reads_old_envelopes(envelope: wire.Envelope) -> None:
    decoded = msgspec.msgpack.decode(wire.encode(envelope), type=EnvelopeV2)
    assert decoded.priority == 0 and decoded.dest == envelope.dest


def test_garbage_is_a_decode_error_not_a_crash() -> None:
    with pytest.raises(msgspec.DecodeError):
        wire.decode_handshake(b"\x93\x63\x00\x00")
    with pytest.raises(msgspec.DecodeError):
        wire.decode_envelope(wire.encode(wire.Accept()))
