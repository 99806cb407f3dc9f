"""Large buffers lent between processes of one machine (``_lending``)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core import PullError, buffer_address
from monarch.core._bulk import _lending, _memory_plane, _ring
from monarch.core._bulk._lending import DESCRIPTOR_SIZE, LEND_MIN, Lender, borrow, is_descriptor
from monarch.core._payload._memory import HUGE_PAGE
from monarch.core._payload._serialize import dumps, loads
from monarch.core.lowlevel import Lent, Loan, Plane

pytestmark = pytest.mark.skipif(not _lending.available(), reason="needs process_vm_readv")

sizes = st.lists(st.sampled_from([0, 100, 5000, LEND_MIN - 1, LEND_MIN, LEND_MIN + 3]), max_size=5)


@settings(max_examples=25, deadline=None)
@given(sizes=sizes, as_bytes=st.lists(st.booleans(), min_size=5, max_size=5))
def test_lent_parts_read_back_equal(sizes: list[int], as_bytes: list[bool]) -> None:
    """Only large parts after the envelope, body and first pickle are lent; reading them
    back (here from this very process) gives the same bytes, and the loans go back."""
    parts: list[bytes | bytearray] = [b"envelope", b"body", b"\x80pickle"]
    for i, size in enumerate(sizes):
        data = os.urandom(size)
        parts.append(data if as_bytes[i] else bytearray(data))
    lender = Lender()
    lent = lender.lend_parts(parts, "unix://@peer")
    large = [i for i, p in enumerate(parts) if i >= 3 and len(p) >= LEND_MIN]
    assert [i for i, p in enumerate(lent) if is_descriptor(p)] == large
    assert len(lender) == len(large)
    back, keys = borrow(lent)
    assert [bytes(p) for p in back] == [bytes(p) for p in parts]
    for i in large:  # a bytes payload arrives as a fresh bytes, any other as a bytearray
        assert type(back[i]) is type(parts[i])
    lender.give_back(keys)
    assert len(lender) == 0


def test_a_dead_borrowers_loans_are_forgotten() -> None:
    lender = Lender()
    big = bytes(LEND_MIN)
    lender.lend_parts([b"e", b"b", b"p", big], "unix://@a")
    lender.lend_parts([b"e", b"b", b"p", big, big], "unix://@b")
    lender.forget("unix://@b")
    assert len(lender) == 1


class SameProcessPlane(Plane):
    """A plane whose lender is this very process: ``lend`` records where a loan is, a
    read copies it from there; what it holds is what the ``Lender`` has not released."""

    name: ClassVar[str] = "same-process"
    order: ClassVar[int] = 1

    def __init__(self, refuse_from: int = 1 << 62) -> None:
        self.held: dict[int, tuple[int, int]] = {}
        self.refuse_from = refuse_from
        """Loans of this size or more cannot be lent through it (as a pinned-memory limit)."""

    def lend(self, buffer_id: int, address: int, size: int) -> tuple[Any, ...] | None:
        if size >= self.refuse_from:
            return None
        assert buffer_id not in self.held
        self.held[buffer_id] = (address, size)
        return (address,)

    def release(self, buffer_id: int) -> None:
        del self.held[buffer_id]  # released once, never twice

    def reaches(self, loan: Loan) -> bool:
        return loan.reach(self.name) is not None

    def read(self, loan: Loan, into: int, deadline: float) -> None:
        address, size = self.held[loan.buffer_id]
        ctypes.memmove(into, address, size)

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        return False


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=8),
    returned=st.lists(st.booleans(), min_size=8, max_size=8),
    refuse_from=st.integers(1, 5000),
)
def test_a_loan_through_a_plane_is_read_through_it_and_released_once(
    sizes: list[int], returned: list[bool], refuse_from: int
) -> None:
    """Lent through a plane: the borrower reads it through the plane, and the plane holds
    exactly the loans not given back, until the borrower is forgotten; a loan the plane
    cannot lend is not lent at all."""
    plane = SameProcessPlane(refuse_from)
    lender = Lender()
    datas = [bytearray(os.urandom(size)) for size in sizes]
    lent_sizes: dict[int, int] = {}
    for data in datas:
        lent = lender.lend(memoryview(data), "peer", plane)
        if len(data) >= refuse_from:
            assert lent is None
            continue
        assert lent is not None
        key, reach = lent
        assert reach is not None
        into = bytearray(len(data))
        plane.read(Lent(key, 0, len(data), ((plane.name, reach),)), buffer_address(into), 0.0)
        assert into == data
        lent_sizes[key] = len(data)
    assert sorted(plane.held) == sorted(lent_sizes) and len(lender) == len(lent_sizes)
    back = [key for key, give in zip(lent_sizes, returned, strict=False) if give]
    lender.give_back(back)
    lender.give_back(back)  # twice: the second finds nothing to release
    kept = {key: size for key, size in lent_sizes.items() if key not in back}
    assert sorted(plane.held) == sorted(kept)
    assert lender.lent_to("peer") == sum(kept.values())
    lender.forget("peer")
    assert plane.held == {} and len(lender) == 0 and lender.lent_to("peer") == 0


def test_descriptors_are_told_apart_from_payloads() -> None:
    assert DESCRIPTOR_SIZE < 4096  # out-of-band buffers are never this small
    assert not is_descriptor(b"\x80" + bytes(DESCRIPTOR_SIZE - 1))  # a pickle
    assert not is_descriptor(bytes(DESCRIPTOR_SIZE))


def test_a_bytes_payload_read_into_bytes_is_not_copied_again() -> None:
    data = os.urandom(LEND_MIN)
    pickle, *buffers = dumps(data)
    assert len(buffers) == 1
    lent = Lender().lend_parts([b"e", b"b", pickle, *buffers], "unix://@x")
    back, _ = borrow(lent)
    received = back[3]
    assert type(received) is bytes
    assert loads([pickle, received]) is received


@contextmanager
def holding_process(script: str) -> Iterator[list[str]]:
    """Run ``script`` in another process until the block ends; yields the words of the
    first line it prints (where its memory is, for the test to read)."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        yield child.stdout.readline().split()
    finally:
        child.communicate("")


def test_another_process_is_read_only_with_its_token() -> None:
    script = """
        import os, sys
        from monarch.core._payload._memory import address_of
        token = b"monarch-token-123"
        print(os.getpid(), address_of(token), flush=True)
        sys.stdin.read()
        """
    with holding_process(script) as words:
        pid, address = map(int, words)
        assert _lending.can_read(pid, address, b"monarch-token-123")
        assert not _lending.can_read(pid, address, b"monarch-token-456")
        assert not _lending.can_read(os.getpid(), address, b"monarch-token-123")
    with pytest.raises(PullError):
        _lending.pull(pid, address, 16)  # gone


@given(size=st.integers(0, 1 << 31))
def test_a_read_is_split_into_aligned_pieces_that_cover_it(size: int) -> None:
    pieces = _memory_plane._pieces(size)
    assert [start for start, _ in pieces] == [0, *(s + n for s, n in pieces[:-1])][: len(pieces)]
    assert sum(length for _, length in pieces) == size
    piece = _memory_plane.PIECE
    assert all(start % HUGE_PAGE == 0 and 0 < length <= piece for start, length in pieces)
    readers = _memory_plane._readers_for(size)
    assert 1 <= readers <= min(_memory_plane.SPLIT_MAX, os.cpu_count() or 1)
    assert readers == 1 or size >= _memory_plane.SPLIT_MIN


@pytest.fixture
def lender_process() -> Iterator[tuple[int, int, int, str, int]]:
    """Another process holding a 24 MiB ``bytes``: its pid, address, size and sha256; and
    the address of 32 MiB of which only the first 24 can be read."""
    script = """
        import ctypes, hashlib, mmap, os, random, sys
        from monarch.core._payload._memory import address_of
        data = random.Random(7).randbytes(24 * 1024 * 1024 + 12345)
        digest = hashlib.sha256(data).hexdigest()
        # 32 MiB mapped, then its last 8 MiB unmapped: a hole after 24 MiB
        holed = mmap.mmap(-1, 32 << 20)
        at = ctypes.addressof(ctypes.c_char.from_buffer(holed))
        assert ctypes.CDLL(None).munmap(ctypes.c_void_p(at + (24 << 20)), 8 << 20) == 0
        print(os.getpid(), address_of(data), len(data), digest, at, flush=True)
        sys.stdin.read()
        """
    with holding_process(script) as (pid, address, size, digest, holed):
        yield int(pid), int(address), int(size), digest, int(holed)


def test_a_large_read_in_pieces_is_whole(
    lender_process: tuple[int, int, int, str, int],
) -> None:
    pid, address, size, digest, _ = lender_process
    for kind in (_lending._BYTES, _lending._BUFFER):
        data = _lending.pull(pid, address, size, kind)
        assert len(data) == size and hashlib.sha256(data).hexdigest() == digest


def test_a_large_read_failing_in_one_piece_raises(
    lender_process: tuple[int, int, int, str, int],
) -> None:
    pid, *_, holed = lender_process
    assert _memory_plane._readers_for(32 << 20) > 1 or (os.cpu_count() or 1) == 1
    assert len(_lending.pull(pid, holed, 24 << 20)) == 24 << 20
    with pytest.raises(PullError, match=f"process {pid}"):
        _lending.pull(pid, holed, 32 << 20)


@pytest.mark.skipif(not _ring.available(), reason="needs memfd, futex, x86-64")
def test_a_loan_from_another_process_comes_through_its_ring() -> None:
    """The borrower opens the lender's ring through /proc and takes what the lender's
    thread pushed there (the slots are full before it looks); the rest, pushed or read
    directly, completes it."""
    script = """
        import hashlib, os, random, sys, time
        from monarch.core._bulk._lending import Lender
        from monarch.core._bulk._ring import SLOT, SLOTS, Ring
        ring = Ring.open()
        data = random.Random(8).randbytes(3 * SLOT + 5)
        lent = Lender().lend_parts([b"e", b"b", b"p", data], "unix://@test", lambda: ring)
        deadline = time.monotonic() + 10
        while ring.filled() < SLOTS and time.monotonic() < deadline:
            time.sleep(0.001)
        print(lent[3].hex(), hashlib.sha256(data).hexdigest(), len(data), flush=True)
        sys.stdin.read()
        """
    with holding_process(script) as (descriptor, digest, size):
        before = _ring.taken_bytes()
        back, keys = borrow([b"e", b"b", b"p", bytes.fromhex(descriptor)], {})
        assert len(back[3]) == int(size) and hashlib.sha256(back[3]).hexdigest() == digest
        assert _ring.taken_bytes() - before >= _ring.SLOT  # at least the first, full slot
        assert len(keys) == 1
