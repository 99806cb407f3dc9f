"""This process's memory advice and receive buffers (``_memory``): the one binding of
``madvise`` the other layers use (``monarch.transport.lowlevel``)."""

from __future__ import annotations

import ctypes

from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.transport import lowlevel as memory

ADDRESSES = st.integers(0, 2**47)


def address_of(data: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(data))


@given(start=ADDRESSES, size=st.integers(0, 64 * memory.HUGE_PAGE))
def test_whole_huge_pages_are_the_largest_aligned_range_inside(start: int, size: int) -> None:
    low, high = memory.whole_huge_pages(start, start + size)
    assert low % memory.HUGE_PAGE == 0 and high % memory.HUGE_PAGE == 0
    if high > low:
        assert start <= low and high <= start + size
    # nothing aligned is left out: one more page at either end would leave the range
    assert low - memory.HUGE_PAGE < start
    assert high + memory.HUGE_PAGE > start + size


@given(size=st.sampled_from([0, 1, 4096, 2 * memory.HUGE_PAGE + 17, 5 * memory.HUGE_PAGE]))
@settings(max_examples=5, deadline=None)
def test_a_fresh_bytearray_has_its_size_and_keeps_what_is_written(size: int) -> None:
    data = memory.fresh_bytearray(size)
    assert type(data) is bytearray
    assert len(data) == size
    pattern = (bytes(range(256)) * (size // 256 + 1))[:size]
    data[:] = pattern
    assert data == pattern


@settings(max_examples=5, deadline=None)
@given(seed=st.binary(min_size=1, max_size=64))
def test_the_huge_page_advice_changes_none_of_the_bytes(seed: bytes) -> None:
    """Whatever the kernel does with the advice (Linux 6.1 moves the pages; older or THP
    off, nothing), every byte of the memory reads as before."""
    size = 4 * memory.HUGE_PAGE
    data = bytearray((seed * (size // len(seed) + 1))[:size])
    before = bytes(data)
    at = address_of(data)
    memory.advise_huge_pages(at, size)
    start, end = memory.whole_huge_pages(at, at + size)
    moved = memory.collapse_to_huge_pages(start, end)
    assert isinstance(moved, bool)
    assert data == before
    assert memory.collapse_to_huge_pages(end, start) is False  # an empty range: nothing
