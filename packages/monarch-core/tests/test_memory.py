"""Fresh large buffers (``_memory``): huge pages, and ``bytes`` reused only when free."""

from __future__ import annotations

import ctypes
import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core._payload import _memory as memory

pytestmark = pytest.mark.skipif(not memory.available(), reason="needs CPython on Linux")

SIZE = memory.SPARE_MIN


def fill(data: bytes, value: int) -> bytes:
    ctypes.memset(memory.address_of(data), value, len(data))
    return data


def test_a_spare_is_reused_only_once_nobody_holds_it() -> None:
    memory._spares._spares.clear()  # no spares left over by other tests
    held = fill(memory.fresh_bytes(SIZE), 1)
    other = fill(memory.fresh_bytes(SIZE), 2)
    assert other is not held  # held is still in use
    assert held[0] == 1 and held[-1] == 1
    address = id(other)
    del other
    gc.collect()
    again = memory.fresh_bytes(SIZE)
    assert id(again) == address  # the free one came back
    assert held[0] == 1  # and the held one was never touched


@settings(max_examples=10, deadline=None)
@given(first=st.integers(0, 255), second=st.integers(0, 255))
def test_a_reused_bytes_hashes_as_its_new_content(first: int, second: int) -> None:
    data = fill(memory.fresh_bytes(SIZE), first)
    assert hash(data) == hash(bytes([first]) * SIZE)  # caches the hash in the object
    del data
    reused = fill(memory.fresh_bytes(SIZE), second)
    assert hash(reused) == hash(bytes([second]) * SIZE)
    assert {reused: 1}[bytes([second]) * SIZE] == 1


def test_small_and_odd_sizes_are_plain_allocations() -> None:
    small = memory.fresh_bytes(1024)
    assert len(small) == 1024
    view = memoryview(bytearray(range(256)) * (SIZE // 256))
    assert memory.copy_to_bytes(view) == bytes(view)


def test_this_processs_anonymous_memory_comes_in_whole_huge_pages_within_its_mappings() -> None:
    held = bytearray(6 * memory.HUGE_PAGE)  # large: a mapping of its own
    at = memory.address_of(held)
    piece = 2 * memory.HUGE_PAGE
    pieces = memory.anonymous_memory(piece)
    assert pieces
    for start, end in pieces:
        assert start % memory.HUGE_PAGE == 0 and end % memory.HUGE_PAGE == 0
        assert 0 < end - start <= piece
    # every whole huge page of the bytearray lies in some piece (its mapping may have
    # merged with a neighbour's, so the pieces need not start where it does)
    first, last = memory.whole_huge_pages(at, at + len(held))
    assert last - first >= 5 * memory.HUGE_PAGE
    for page in range(first, last, memory.HUGE_PAGE):
        assert any(s <= page and page + memory.HUGE_PAGE <= e for s, e in pieces), hex(page)
