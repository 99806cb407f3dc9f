"""Sealed frames, sans I/O: round trips under any chunking and runs, every bit counts."""

from __future__ import annotations

import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import FrameAuthenticationError, ProtocolError
from monarch.transport._framing import (
    SMALL_PART,
    FrameDecoder,
    encode_frame,
    encode_frame_into,
    seal_into,
)
from monarch.transport._mac import DIGEST_FROM, SEAL_HEADER, SEAL_SIZE, TAG_SIZE, FrameMac

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


def runs_of(
    frames: list[list[bytes]], sealed_after: set[int], key: bytes = KEY, poly1305: bool = False
) -> list[bytes]:
    """The wire bytes of each run: its frames and its seal, as one sender makes them; a
    run ends after each frame index in ``sealed_after`` and after the last frame."""
    mac = FrameMac(key, poly1305=poly1305)
    runs: list[bytes] = []
    out: list[bytearray | memoryview] = []
    for i, parts in enumerate(frames):
        encode_frame_into(out, parts, mac=mac)
        if i in sealed_after or i == len(frames) - 1:
            seal_into(out, mac)
            runs.append(b"".join(bytes(b) for b in out))
            out = []
    return runs


def run_lengths(frames: list[list[bytes]], sealed_after: set[int]) -> list[int]:
    ends = sorted({i for i in sealed_after if i < len(frames) - 1} | {len(frames) - 1})
    return [b - a for a, b in zip([-1, *ends], ends, strict=False)]


Decoded = tuple[list[list[bytes]], FrameDecoder, ProtocolError | None]


def feed(stream: bytes, cuts: list[int], poly1305: bool = False, **kwargs: int) -> Decoded:
    """Feed ``stream`` cut at ``cuts``: the frames handed out (those sealed before an
    error too, as a connection does), the decoder, and the ProtocolError that stopped it."""
    decoder = FrameDecoder(mac=FrameMac(KEY, poly1305=poly1305), **kwargs)
    frames: list[list[bytes]] = []
    at = 0
    try:
        for cut in [*sorted(set(cuts)), len(stream)]:
            if cut > at:
                decoder.feed(stream[at:cut])
                at = cut
            while (frame := decoder.next_frame()) is not None:
                frames.append([bytes(p) for p in frame])
    except ProtocolError as exc:
        while (frame := decoder.next_frame()) is not None:
            frames.append([bytes(p) for p in frame])
        return frames, decoder, exc
    return frames, decoder, None


def decode(
    stream: bytes, cuts: list[int], poly1305: bool = False, **kwargs: int
) -> tuple[list[list[bytes]], FrameDecoder]:
    """The frames of ``stream`` and the decoder; raises what stopped it."""
    frames, decoder, error = feed(stream, cuts, poly1305, **kwargs)
    if error is not None:
        raise error
    return frames, decoder


small_buffers = {"buffer_size": 64, "min_read": 16}


@settings(max_examples=200, deadline=None)
@given(frames=frames_st, data=st.data(), small=st.booleans(), poly1305=st.booleans())
def test_round_trip_under_arbitrary_chunking_and_runs(
    frames: list[list[bytes]], data: st.DataObject, small: bool, poly1305: bool
) -> None:
    """Small buffers (``small``) send the larger frames down the read-in-place path,
    hashed piece by piece as the bytes arrive; ``poly1305``: large parts MACed by it."""
    sealed_after = set(data.draw(st.lists(st.integers(0, len(frames) - 1)), label="seals"))
    stream = b"".join(runs_of(frames, sealed_after, poly1305=poly1305))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=30), label="cuts")
    decoded, decoder = decode(stream, cuts, poly1305, **(small_buffers if small else {}))
    assert decoded == frames
    assert not decoder.mid_frame


@settings(max_examples=300, deadline=None)
@given(frames=frames_st, data=st.data(), small=st.booleans(), poly1305=st.booleans())
def test_any_single_bit_flip_is_detected(
    frames: list[list[bytes]], data: st.DataObject, small: bool, poly1305: bool
) -> None:
    """Flip one bit anywhere: the runs before it arrive, nothing of the run it hit nor of
    any after; the decoder raises a ProtocolError or waits for bytes that never come."""
    sealed_after = set(data.draw(st.lists(st.integers(0, len(frames) - 1)), label="seals"))
    runs = runs_of(frames, sealed_after, poly1305=poly1305)
    stream = bytearray(b"".join(runs))
    bit = data.draw(st.integers(0, 8 * len(stream) - 1), label="bit")
    stream[bit // 8] ^= 1 << (bit % 8)
    hit, at = 0, 0
    while at + len(runs[hit]) <= bit // 8:
        at += len(runs[hit])
        hit += 1
    intact = frames[: sum(run_lengths(frames, sealed_after)[:hit])]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10), label="cuts")
    options = {"max_frame_size": 1 << 20}  # a length flipped high is refused, not allocated
    if small:
        options.update(small_buffers)
    decoded, decoder, error = feed(bytes(stream), cuts, poly1305, **options)
    assert decoded == intact
    assert error is not None or decoder.mid_frame  # else a length flipped upwards: waiting


def sealed(*frames: list[bytes], key: bytes = KEY) -> list[bytes]:
    """Each frame a run of its own, as ``send`` makes them."""
    mac = FrameMac(key)
    return [b"".join(bytes(b) for b in encode_frame(f, mac=mac)[0]) for f in frames]


def test_a_replayed_run_fails() -> None:
    first, _ = sealed([b"pay 10"], [b"pay 20"])
    with pytest.raises(FrameAuthenticationError, match="seal 1 failed authentication"):
        decode(first + first, [])


def test_reordered_runs_fail() -> None:
    first, second = sealed([b"open"], [b"close"])
    with pytest.raises(FrameAuthenticationError, match="seal 0"):
        decode(second + first, [])


def test_a_dropped_run_fails_the_next() -> None:
    first, _, third = sealed([b"a"], [b"b"], [b"c"])
    with pytest.raises(FrameAuthenticationError, match="seal 1"):
        decode(first + third, [])


def test_a_run_under_another_key_fails() -> None:
    (forged,) = sealed([b"import os; os.system('...')"], key=OTHER_KEY)
    with pytest.raises(FrameAuthenticationError):
        decode(forged, [])


def test_a_frame_slipped_into_a_run_fails_the_run() -> None:
    """A relay splicing a frame before a genuine seal: the whole run is refused."""
    (run,) = sealed([b"genuine"])
    frame, seal = run[:-SEAL_SIZE], run[-SEAL_SIZE:]
    evil = encode_frame([b"evil"])[0][0]
    for stream in (bytes(evil) + run, frame + bytes(evil) + seal):
        with pytest.raises(FrameAuthenticationError):
            decode(stream, [])


def test_a_moved_seal_fails() -> None:
    """Two frames in one run: a seal forged after the first cannot be made, and the
    genuine one after the second does not cover the first alone."""
    (run,) = runs_of([[b"a"], [b"b"]], set())
    first_end = 12 + 1
    with pytest.raises(FrameAuthenticationError):
        decode(run[:first_end] + run[-SEAL_SIZE:], [])


def test_frames_are_held_until_their_seal() -> None:
    (run,) = runs_of([[b"a"], [b"b" * 5000]], set())
    decoded, decoder = decode(run[:-1], [])
    assert decoded == [] and decoder.mid_frame and decoder.pending_frames == 0
    decoder.feed(run[-1:])
    assert decoder.pending_frames == 2


def test_an_empty_seal_cannot_be_forged() -> None:
    with pytest.raises(FrameAuthenticationError):
        decode(SEAL_HEADER + os.urandom(TAG_SIZE), [])


@pytest.mark.parametrize("size", [10, DIGEST_FROM + 1, 300_000])
def test_a_changed_length_fails_even_when_the_bytes_add_up(size: int) -> None:
    """A relay shortening a frame and passing its last byte off as another frame."""
    (run,) = sealed([b"y" * size])
    shorter = struct.pack("<IQ", 1, size - 1) + run[12 : 12 + size - 1]
    extra = struct.pack("<IQ", 1, 1) + run[11 + size : 12 + size]
    with pytest.raises(FrameAuthenticationError):
        decode(shorter + extra + run[-SEAL_SIZE:], [], min_read=1024)


@pytest.mark.parametrize("size", [SMALL_PART + 1, 1 << 20])
def test_a_large_frame_is_checked_before_it_is_handed_out(size: int) -> None:
    (run,) = sealed([b"head", os.urandom(size)])
    tampered = bytearray(run)
    tampered[-SEAL_SIZE - 1] ^= 0x80  # the last byte of the body
    decoder = FrameDecoder(mac=FrameMac(KEY), min_read=1024)
    decoder.feed(tampered[:2000])  # the header first: the body is read in place
    decoder.feed(tampered[2000:-SEAL_SIZE])
    assert decoder.next_frame() is None  # whole, but not sealed yet
    with pytest.raises(FrameAuthenticationError):
        decoder.feed(tampered[-SEAL_SIZE:])
    assert decoder.next_frame() is None


def test_the_sender_and_receiver_count_seals_alike() -> None:
    frames = [[b"a"], [b"b" * 5000], [], [b"", b"c"]]
    stream = b"".join(runs_of(frames, {0, 2}))
    decoded, decoder = decode(stream, [])
    assert decoded == frames
    assert decoder._mac is not None and decoder._mac.seq == 3


def test_nothing_to_seal_adds_nothing() -> None:
    mac = FrameMac(KEY)
    out: list[bytearray | memoryview] = []
    assert seal_into(out, mac) == 0 and out == []
    with pytest.raises(ValueError, match="no frame"):
        mac.seal()


def test_both_sides_must_agree_on_poly1305() -> None:
    """A run MACed with Poly1305 for its large parts does not check as SHA-256's."""
    (run,) = runs_of([[b"big", os.urandom(SMALL_PART + 1)]], set(), poly1305=True)
    assert decode(run, [], poly1305=True)[0][0][0] == b"big"
    with pytest.raises(FrameAuthenticationError):
        decode(run, [], poly1305=False)


def test_each_large_part_gets_its_own_poly1305_key() -> None:
    mac = FrameMac(KEY, poly1305=True)
    keys = set()
    for _ in range(3):
        for i in range(3):
            part = mac.part_mac(i)
            part.update(b"same bytes")
            keys.add(part.finish())
        mac.seq += 1
    assert len(keys) == 9


def test_a_key_is_32_bytes() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        FrameMac(b"short")


@settings(max_examples=50, deadline=None)
@given(
    messages=st.lists(
        st.tuples(st.binary(max_size=40), st.lists(st.binary(max_size=3000), max_size=4)),
        min_size=1,
        max_size=5,
    ),
    flip=st.integers(0, 2**16),
)
def test_a_run_sealed_as_absorbed_checks_like_any_run(
    messages: list[tuple[bytes, list[bytes]]], flip: int
) -> None:
    """``seal_absorbed``: a sender that hashes a message's bytes slice by slice as it
    sends them (monarch-rdma's TCP plane) seals what the receiver ``check`` s, message
    after message; a changed byte anywhere fails its message."""
    sender, receiver = FrameMac(KEY, poly1305=True), FrameMac(KEY, poly1305=True)
    for header, slices in messages:
        sender.absorb(header)
        part = sender.next_part_mac()
        for piece in slices:
            part.update(piece)
        sender.absorb(part.finish())
        tag = sender.seal_absorbed()
        receiver.absorb(header)
        theirs = receiver.next_part_mac()
        theirs.update(b"".join(slices))
        receiver.absorb(theirs.finish())
        receiver.check(tag)
    assert sender.seq == receiver.seq == len(messages)
    header, slices = messages[-1]
    whole = bytearray(header + b"".join(slices))
    if not whole:
        return
    whole[flip % len(whole)] ^= 1
    changed_header, changed_data = bytes(whole[: len(header)]), bytes(whole[len(header) :])
    sender.absorb(header)
    part = sender.next_part_mac()
    part.update(b"".join(slices))
    sender.absorb(part.finish())
    tag = sender.seal_absorbed()
    receiver.absorb(changed_header)
    theirs = receiver.next_part_mac()
    theirs.update(changed_data)
    receiver.absorb(theirs.finish())
    with pytest.raises(FrameAuthenticationError):
        receiver.check(tag)
