"""The framing codec: round trips under any chunking, limits, zero-copy parts."""

from __future__ import annotations

import array
import random
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import FrameTooLarge
from monarch.transport._framing import SMALL_PART, FrameDecoder, encode_frame

# Large parts come from a seeded generator: hypothesis draws their size, not each byte.
large_part = st.builds(
    lambda seed, size: random.Random(seed).randbytes(size),
    st.integers(0, 2**32),
    st.integers(SMALL_PART - 2, SMALL_PART + 70_000),
)
small_part = st.binary(max_size=64)
medium_part = st.builds(
    lambda seed, size: random.Random(seed).randbytes(size),
    st.integers(0, 2**32),
    st.integers(0, 3000),
)
parts_st = st.lists(st.one_of(small_part, large_part), max_size=6)
frames_st = st.lists(parts_st, min_size=1, max_size=8)
small_frames_st = st.lists(
    st.lists(st.one_of(small_part, medium_part), max_size=5), min_size=1, max_size=6
)


def wire(frames: list[list[bytes]]) -> bytes:
    out = bytearray()
    for parts in frames:
        bufs, size = encode_frame(parts)
        joined = b"".join(bytes(b) for b in bufs)
        assert len(joined) == size
        out += joined
    return bytes(out)


def decode_chunked(data: bytes, cuts: list[int], **kwargs: Any) -> list[list[bytes]]:
    decoder = FrameDecoder(**kwargs)
    frames: list[list[bytes]] = []
    at = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        chunk = data[at:cut]
        at = max(at, cut)
        while chunk:
            buf = decoder.get_buffer()
            assert buf.nbytes > 0
            n = min(len(chunk), buf.nbytes)
            buf[:n] = chunk[:n]
            buf.release()
            decoder.buffer_updated(n)
            chunk = chunk[n:]
        while (frame := decoder.next_frame()) is not None:
            frames.append([bytes(p) for p in frame])
    assert not decoder.mid_frame
    return frames


@settings(max_examples=200, deadline=None)
@given(frames=frames_st, data=st.data())
def test_round_trip_under_arbitrary_chunking(
    frames: list[list[bytes]], data: st.DataObject
) -> None:
    raw = wire(frames)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=30))
    assert decode_chunked(raw, cuts) == frames


@settings(max_examples=100, deadline=None)
@given(frames=small_frames_st, size=st.integers(1, 512))
def test_round_trip_with_small_fixed_reads_and_tiny_buffers(
    frames: list[list[bytes]], size: int
) -> None:
    raw = wire(frames)
    cuts = list(range(0, len(raw), size))
    assert decode_chunked(raw, cuts, buffer_size=64, min_read=16) == frames


@settings(max_examples=100, deadline=None)
@given(streams=st.lists(small_frames_st, min_size=2, max_size=4), data=st.data())
def test_interleaved_streams_decode_independently(
    streams: list[list[list[bytes]]], data: st.DataObject
) -> None:
    """Chunks of several streams interleaved into their own decoders never mix."""
    raws = [wire(frames) for frames in streams]
    decoders = [FrameDecoder() for _ in streams]
    offsets = [0] * len(streams)
    out: list[list[list[bytes]]] = [[] for _ in streams]
    while any(o < len(r) for o, r in zip(offsets, raws, strict=True)):
        live = [i for i, (o, r) in enumerate(zip(offsets, raws, strict=True)) if o < len(r)]
        i = data.draw(st.sampled_from(live))
        n = data.draw(st.integers(1, len(raws[i]) - offsets[i]))
        decoders[i].feed(raws[i][offsets[i] : offsets[i] + n])
        offsets[i] += n
        while (frame := decoders[i].next_frame()) is not None:
            out[i].append([bytes(p) for p in frame])
    assert out == streams


def test_large_parts_are_sent_in_place_and_small_ones_coalesced() -> None:
    big = bytearray(SMALL_PART + 1)
    bufs, size = encode_frame([b"a", big, b"b"])
    assert len(bufs) == 3
    assert isinstance(bufs[1], memoryview) and bufs[1].obj is big
    assert size == 4 + 3 * 8 + 1 + len(big) + 1


def test_large_frame_is_read_into_one_exact_allocation() -> None:
    payload = bytes(range(256)) * 1024
    raw = wire([[b"head", payload]])
    decoder = FrameDecoder(min_read=1024)
    decoder.feed(raw[:1000])
    buf = decoder.get_buffer()
    assert buf.nbytes == 4 + len(payload) - (1000 - 4 - 16)
    buf.release()
    decoder.feed(raw[1000:])
    frame = decoder.next_frame()
    assert frame is not None
    assert bytes(frame[1]) == payload
    assert not frame[1].readonly  # a writable buffer, e.g. for torch.frombuffer


def test_typed_buffers_are_sent_as_bytes() -> None:
    arr = array.array("d", [1.5, 2.5, 3.5])
    matrix = memoryview(bytearray(24)).cast("B", (4, 6))
    raw = wire([[arr, matrix]])  # type: ignore[list-item]
    assert decode_chunked(raw, []) == [[arr.tobytes(), bytes(24)]]


def test_non_contiguous_part_is_refused() -> None:
    strided = memoryview(bytearray(10))[::2]
    with pytest.raises(ValueError, match="contiguous"):
        encode_frame([strided])


def test_sender_limits_raise_before_encoding() -> None:
    with pytest.raises(FrameTooLarge, match="max_frame_size=10"):
        encode_frame([b"x" * 11], max_frame_size=10)
    with pytest.raises(FrameTooLarge, match="max_parts=2"):
        encode_frame([b"", b"", b""], max_parts=2)
    assert isinstance(FrameTooLarge("x"), ValueError)


def test_receiver_refuses_oversized_frame_from_its_header_alone() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    with pytest.raises(FrameTooLarge, match="max_frame_size=100"):
        decoder.feed(struct.pack("<IQ", 1, 101))


def test_receiver_refuses_too_many_parts() -> None:
    decoder = FrameDecoder(max_parts=4)
    with pytest.raises(FrameTooLarge, match="max_parts=4"):
        decoder.feed(struct.pack("<I", 5))


def test_empty_frame_and_empty_parts() -> None:
    assert decode_chunked(wire([[], [b""], [b"", b"x"]]), []) == [[], [b""], [b"", b"x"]]


def test_buffer_updated_rejects_nonsense() -> None:
    decoder = FrameDecoder(buffer_size=16, min_read=8)
    with pytest.raises(ValueError, match="positive"):
        decoder.buffer_updated(0)
    size = decoder.get_buffer().nbytes
    with pytest.raises(ValueError, match="more bytes"):
        decoder.buffer_updated(size + 1)


def test_large_buffer_is_reused_only_when_nothing_refers_to_it() -> None:
    decoder = FrameDecoder(min_read=1024)

    def large(fill: int) -> None:
        raw = wire([[bytes([fill]) * 100_000]])
        decoder.feed(raw[:500])  # the header arrives first: the rest is read in place
        decoder.feed(raw[500:])

    large(1)
    held = decoder.next_frame()
    assert held is not None
    large(2)
    second = decoder.next_frame()
    assert second is not None
    assert second[0].obj is not held[0].obj  # the first frame is still referenced
    assert bytes(held[0]) == b"\x01" * 100_000  # and was not overwritten
    second_buffer_id = id(second[0].obj)
    del second
    large(3)
    third = decoder.next_frame()
    assert third is not None
    assert id(third[0].obj) == second_buffer_id  # unreferenced: reused
    assert bytes(third[0]) == b"\x03" * 100_000
