"""Frames with a MAC, sans I/O: round trips under any chunking, and every bit counts."""

from __future__ import annotations

import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import FrameAuthenticationError, ProtocolError
from monarch.transport._framing import SMALL_PART, FrameDecoder, encode_frame
from monarch.transport._mac import DIGEST_FROM, TAG_SIZE, FrameMac

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))

part_st = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda seed, size: random.Random(seed).randbytes(size),
        st.integers(0, 2**32),
        st.sampled_from([DIGEST_FROM - 1, DIGEST_FROM, DIGEST_FROM + 1, 3000, SMALL_PART + 1]),
    ),
)
frames_st = st.lists(st.lists(part_st, max_size=4), min_size=1, max_size=6)


def sealed(frames: list[list[bytes]], key: bytes = KEY) -> list[bytes]:
    """Each frame as its bytes on the wire, tags made by one sender in order."""
    mac = FrameMac(key)
    return [b"".join(bytes(b) for b in encode_frame(f, mac=mac)[0]) for f in frames]


def decode(stream: bytes, cuts: list[int], **kwargs: int) -> tuple[list[list[bytes]], FrameDecoder]:
    """Feed ``stream`` cut at ``cuts``; the frames decoded (until an error) and the decoder."""
    decoder = FrameDecoder(mac=FrameMac(KEY), **kwargs)
    frames: list[list[bytes]] = []
    at = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        if cut > at:
            decoder.feed(stream[at:cut])
            at = cut
        while (frame := decoder.next_frame()) is not None:
            frames.append([bytes(p) for p in frame])
    return frames, decoder


@settings(max_examples=200, deadline=None)
@given(frames=frames_st, data=st.data(), small=st.booleans())
def test_round_trip_under_arbitrary_chunking(
    frames: list[list[bytes]], data: st.DataObject, small: bool
) -> None:
    """Small buffers (``small``) send the larger frames down the read-in-place path,
    whose MAC is computed piece by piece as the bytes arrive."""
    stream = b"".join(sealed(frames))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30))
    options = {"buffer_size": 64, "min_read": 16} if small else {}
    decoded, decoder = decode(stream, cuts, **options)
    assert decoded == frames
    assert not decoder.mid_frame


@settings(max_examples=300, deadline=None)
@given(frames=frames_st, data=st.data(), small=st.booleans())
def test_any_single_bit_flip_is_detected(
    frames: list[list[bytes]], data: st.DataObject, small: bool
) -> None:
    """Flip one bit anywhere: the frames before it arrive, the one it hit never does, nor
    anything after; the decoder raises a ProtocolError or waits for bytes that never come."""
    wire = sealed(frames)
    stream = bytearray(b"".join(wire))
    bit = data.draw(st.integers(0, 8 * len(stream) - 1), label="bit")
    stream[bit // 8] ^= 1 << (bit % 8)
    hit, at = 0, 0
    while at + len(wire[hit]) <= bit // 8:
        at += len(wire[hit])
        hit += 1
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    options = {"max_frame_size": 1 << 20}  # a length flipped high is refused, not allocated
    if small:
        options.update(buffer_size=64, min_read=16)
    try:
        decoded, decoder = decode(bytes(stream), cuts, **options)
    except ProtocolError:
        pass  # tag mismatch, or a length flipped beyond the limits
    else:
        assert decoded == frames[:hit]
        assert decoder.mid_frame  # a length flipped upwards: the rest is awaited
        return


def test_a_replayed_frame_fails() -> None:
    first, _ = sealed([[b"pay 10"], [b"pay 20"]])
    with pytest.raises(FrameAuthenticationError, match="frame 1 failed authentication"):
        decode(first + first, [])


def test_reordered_frames_fail() -> None:
    first, second = sealed([[b"open"], [b"close"]])
    with pytest.raises(FrameAuthenticationError, match="frame 0"):
        decode(second + first, [])


def test_a_dropped_frame_fails_the_next() -> None:
    first, _, third = sealed([[b"a"], [b"b"], [b"c"]])
    with pytest.raises(FrameAuthenticationError, match="frame 1"):
        decode(first + third, [])


def test_a_frame_under_another_key_fails() -> None:
    (forged,) = sealed([[b"import os; os.system('...')"]], key=OTHER_KEY)
    with pytest.raises(FrameAuthenticationError):
        decode(forged, [])


def test_a_frame_without_its_tag_never_completes() -> None:
    (whole,) = sealed([[b"x" * 100]])
    frames, decoder = decode(whole[:-TAG_SIZE], [])
    assert frames == [] and decoder.mid_frame


@pytest.mark.parametrize("size", [10, DIGEST_FROM + 1, 300_000])
def test_a_changed_length_fails_even_when_the_bytes_add_up(size: int) -> None:
    """A relay shortening a frame and passing the rest off as the tag is caught."""
    (whole,) = sealed([[b"y" * size]])
    shorter = struct.pack("<IQ", 1, size - 1) + whole[12:]
    with pytest.raises(FrameAuthenticationError):
        decode(shorter, [], min_read=1024)


@pytest.mark.parametrize("size", [SMALL_PART + 1, 1 << 20])
def test_a_large_frame_is_checked_before_it_is_handed_out(size: int) -> None:
    (whole,) = sealed([[b"head", os.urandom(size)]])
    tampered = bytearray(whole)
    tampered[-TAG_SIZE - 1] ^= 0x80  # the last byte of the body
    decoder = FrameDecoder(mac=FrameMac(KEY), min_read=1024)
    decoder.feed(tampered[:2000])  # the header first: the body is read in place
    with pytest.raises(FrameAuthenticationError):
        decoder.feed(tampered[2000:])
    assert decoder.next_frame() is None


def test_the_sender_and_receiver_count_frames_alike() -> None:
    mac = FrameMac(KEY)
    frames = [[b"a"], [b"b" * 5000], [], [b"", b"c"]]
    stream = b"".join(b"".join(bytes(b) for b in encode_frame(f, mac=mac)[0]) for f in frames)
    assert mac.seq == len(frames)
    decoded, decoder = decode(stream, [])
    assert decoded == frames
    assert decoder._mac is not None and decoder._mac.seq == len(frames)


def test_a_key_is_32_bytes() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        FrameMac(b"short")
