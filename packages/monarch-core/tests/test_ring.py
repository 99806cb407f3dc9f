"""Loans pushed through a ring of shared memory (``_ring``), and read whole whatever the
pusher does: in time, late, never, or for frames that come out of order."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core._bulk import _lending, _ring
from monarch.core._bulk._lending import Lender, borrow
from monarch.core._bulk._ring import SLOT, SLOTS, Ring, RingReader
from monarch.core.testing import wait_until

pytestmark = pytest.mark.skipif(
    not (_ring.available() and _lending.available()), reason="needs memfd, futex, x86-64"
)


@pytest.fixture
def ring() -> Iterator[Ring]:
    made = Ring.open()
    assert made is not None
    yield made
    made.close()


def reader_of(ring: Ring) -> RingReader:
    reader = RingReader.open(os.getpid(), ring.fd, ring.id)
    assert reader is not None
    return reader


def message(data: bytes | bytearray) -> list[bytes | bytearray]:
    return [b"envelope", b"body", b"\x80pickle", data]


def test_a_loan_the_ring_holds_is_taken_from_it(ring: Ring) -> None:
    data = random.Random(1).randbytes(SLOTS * SLOT - 12345)  # fills every slot, just
    lent = Lender().lend_parts(message(data), "unix://@peer", lambda: ring)
    wait_until(lambda: ring.filled() == SLOTS, 10, "the pusher has filled the ring")
    before = _ring.taken_bytes()
    back, keys = borrow(lent, {})
    assert back[3] == data and type(back[3]) is bytes and len(keys) == 1
    # The first slot is always taken; the second too, unless this thread was kept off the
    # CPU long enough while copying the first that it left the ring (see _ring.SLOW).
    assert _ring.taken_bytes() - before in (SLOT, len(data))


def test_a_loan_never_pushed_is_read_directly(ring: Ring) -> None:
    data = bytearray(random.Random(2).randbytes(3 * SLOT + 1))
    from monarch.core._payload._memory import address_of

    before = _ring.taken_bytes()
    got = _lending.pull(os.getpid(), address_of(data), len(data), ring=reader_of(ring), loan=1)
    assert got == data and _ring.taken_bytes() == before


def test_a_loan_whose_frame_comes_after_a_later_ones_is_read_directly(ring: Ring) -> None:
    first, second = (random.Random(seed).randbytes(2 * SLOT + 7) for seed in (3, 4))
    lender = Lender()
    rings: dict[_lending.RingKey, RingReader | None] = {}
    lent_first = lender.lend_parts(message(first), "unix://@peer", lambda: ring)
    lent_second = lender.lend_parts(message(second), "unix://@peer", lambda: ring)
    assert borrow(lent_second, rings)[0][3] == second
    before = _ring.taken_bytes()
    assert borrow(lent_first, rings)[0][3] == first
    assert _ring.taken_bytes() == before  # the lender was told to move past it


@settings(max_examples=20, deadline=None)
@given(
    sizes=st.lists(
        st.sampled_from([SLOT - 1, SLOT, SLOT + 1, 2 * SLOT + 4097, 3 * SLOT]),
        min_size=1,
        max_size=5,
    ),
    seed=st.integers(0, 2**16),
    dropped=st.sets(st.integers(0, 4), max_size=2),
)
def test_loans_are_read_whole_in_any_order_with_some_never_read(
    sizes: list[int], seed: int, dropped: set[int]
) -> None:
    """Frames may reach the borrower in another order than their loans were pushed, and
    some never (a message dropped before it is read): whatever each loan is read from
    (its slots, leftovers of others skipped), it comes back as it was lent."""
    ring = Ring.open()
    assert ring is not None
    try:
        rng = random.Random(seed)
        lender = Lender()
        rings: dict[_lending.RingKey, RingReader | None] = {}
        sent = [rng.randbytes(size) for size in sizes]
        lent = [lender.lend_parts(message(data), "unix://@peer", lambda: ring) for data in sent]
        order = [i for i in range(len(sent)) if i not in dropped]
        rng.shuffle(order)
        for i in order:
            back, keys = borrow(lent[i], rings)
            assert back[3] == sent[i]
            lender.give_back(keys)
    finally:
        ring.close()


def test_the_pusher_leaves_a_loan_nobody_takes_and_goes_on(ring: Ring) -> None:
    other = Ring.open()
    assert other is not None
    try:
        Lender().lend_parts(message(bytes(3 * SLOT)), "unix://@gone", lambda: ring)  # never taken
        data = random.Random(5).randbytes(SLOT)
        lent = Lender().lend_parts(message(data), "unix://@peer", lambda: other)
        wait_until(lambda: other.filled() == 1, 10, "the next ring's loan is pushed")
        assert borrow(lent, {})[0][3] == data
    finally:
        other.close()


def test_what_is_not_a_ring_is_not_opened(ring: Ring) -> None:
    pid = os.getpid()
    assert RingReader.open(pid, ring.fd, ring.id ^ 2) is None  # another ring's id
    assert RingReader.open(pid, 987654, ring.id) is None  # no such fd
    with tempfile.TemporaryFile() as plain:
        plain.write(bytes(_ring.SIZE))
        plain.flush()
        assert RingReader.open(pid, plain.fileno(), ring.id) is None  # a file, id all zero
    data = random.Random(6).randbytes(SLOT + 3)
    lent = Lender().lend_parts(message(data), "unix://@peer", lambda: ring)
    rings: dict[_lending.RingKey, RingReader | None] = {(pid, ring.fd, ring.id): None}
    assert borrow(lent, rings)[0][3] == data  # a ring that cannot be opened: read directly


def test_a_ring_is_asked_for_only_by_a_loan_it_would_carry(ring: Ring) -> None:
    """A peer lent only buffers below RING_MIN gets no ring (a process keeps few)."""
    asked: list[Ring] = []

    def ring_to_peer() -> Ring:
        asked.append(ring)
        return ring

    lender = Lender()
    lender.lend_parts(message(bytes(_lending.LEND_MIN)), "unix://@peer", ring_to_peer)
    assert asked == []
    lent = lender.lend_parts(message(bytes(_ring.RING_MIN)), "unix://@peer", ring_to_peer)
    assert asked == [ring]
    assert borrow(lent, {})[0][3] == bytes(_ring.RING_MIN)
