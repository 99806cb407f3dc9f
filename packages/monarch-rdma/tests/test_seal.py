"""The TCP plane's tags (``_seal``): a message's tag does not depend on how its bytes were
sliced as they were fed, and changes with any byte, its header, its number or its key."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from monarch.rdma._seal import TAG_SIZE, Behind, Seal

KEY = bytes(range(32))


def _tag(key: bytes, header: bytes, data: bytes, cuts: list[int], skip: int = 0) -> bytes:
    seal = Seal(key)
    for _ in range(skip):
        seal.skip()
    tagger = seal.start(header)
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for start, end in itertools.pairwise(edges):
        tagger.update(memoryview(data)[start:end])
    return tagger.digest(len(data) > 0)


def _tag_behind(header: bytes, data: bytes, cuts: list[int]) -> bytes:
    """``_tag``, the slices tagged on a bulk thread one behind (``Behind``)."""
    tagger = Seal(KEY).start(header)
    behind = Behind(tagger)
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for start, end in itertools.pairwise(edges):
        behind.update(memoryview(data)[start:end])
    behind.wait()
    behind.wait()  # a second wait has nothing left to wait for
    return tagger.digest(len(data) > 0)


@given(
    header=st.binary(max_size=32),
    data=st.binary(min_size=1, max_size=5000),
    cuts=st.lists(st.integers(0, 5000), max_size=6),
)
def test_the_tag_does_not_depend_on_the_slices(header: bytes, data: bytes, cuts: list[int]) -> None:
    whole = _tag(KEY, header, data, [])
    assert len(whole) == TAG_SIZE
    assert _tag(KEY, header, data, cuts) == whole
    assert Seal(KEY).tag(header, memoryview(data)) == whole
    assert Seal(KEY).check(whole, header, memoryview(data))


@given(
    header=st.binary(max_size=32),
    data=st.binary(min_size=1, max_size=5000),
    at=st.integers(0, 4999),
    bit=st.integers(0, 7),
)
def test_any_change_changes_the_tag(header: bytes, data: bytes, at: int, bit: int) -> None:
    tag = _tag(KEY, header, data, [])
    changed = bytearray(data)
    changed[at % len(data)] ^= 1 << bit
    assert _tag(KEY, header, bytes(changed), []) != tag
    assert _tag(KEY, header + b"x", data, []) != tag
    assert _tag(KEY, header, data, [], skip=1) != tag  # another message number
    assert _tag(bytes(32), header, data, []) != tag
    assert _tag(KEY, header, data + b"\0", []) != tag


@given(
    header=st.binary(max_size=32),
    data=st.binary(min_size=1, max_size=5000),
    cuts=st.lists(st.integers(0, 5000), max_size=12),
)
def test_slices_tagged_behind_the_copy_give_the_same_tag(
    header: bytes, data: bytes, cuts: list[int]
) -> None:
    assert _tag_behind(header, data, cuts) == _tag(KEY, header, data, [])
