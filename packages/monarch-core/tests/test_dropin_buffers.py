"""Drop-in: upstream's write ``Buffer`` (its 0.3 release's zero-copy buffer), at the path users
import it from. Small writes are copied, ``bytes`` from ``small_write_threshold`` up are kept
as references, ``freeze()`` gives a ``FrozenBuffer`` read like a file.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 (CPython's reference counts show what a buffer keeps).
"""

from __future__ import annotations

import pickle
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch._rust_bindings.monarch_hyperactor.buffers import Buffer, FrozenBuffer
from monarch.config import configured


def kept(data: object, buffer: Buffer | None = None) -> bool:
    """Whether writing ``data`` made the buffer hold the object itself."""
    buffer = Buffer() if buffer is None else buffer
    before = sys.getrefcount(data)
    buffer.write(data)
    return sys.getrefcount(data) > before


def frozen(*writes: bytes) -> FrozenBuffer:
    buffer = Buffer()
    for data in writes:
        buffer.write(data)
    return buffer.freeze()


def test_bytes_from_the_threshold_up_are_kept_smaller_ones_copied() -> None:
    assert kept(b"a" * 256) and kept(b"a" * 300)
    assert not kept(b"b" * 255)
    assert not kept(memoryview(b"c" * 300))  # not bytes: copied, whatever its size
    assert not kept(bytearray(b"d" * 300))


def test_the_threshold_is_configured_and_read_when_the_buffer_is_made() -> None:
    made_before = Buffer()
    with configured(small_write_threshold=100):
        assert kept(b"x" * 150) and not kept(b"x" * 50)
        assert kept(b"y" * 300, made_before)  # still 256 for it
    assert not kept(b"z" * 150)


def test_a_mutable_buffer_is_taken_as_it_was_written() -> None:
    small, large = bytearray(b"s" * 10), bytearray(b"l" * 1000)
    buffer = Buffer()
    assert buffer.write(small) == 10 and buffer.write(large) == 1000
    small[0] = large[0] = ord("!")
    assert frozen_bytes(buffer) == b"s" * 10 + b"l" * 1000


def frozen_bytes(buffer: Buffer) -> bytes:
    return buffer.freeze().read()


def test_writes_keep_their_order_and_freeze_empties_the_buffer() -> None:
    buffer = Buffer()
    writes = [b"a", b"b" * 300, memoryview(b"c" * 3), b"d" * 2000, bytearray(b"e")]
    assert [buffer.write(w) for w in writes] == [1, 300, 3, 2000, 1]
    assert len(buffer) == 2305
    data = buffer.freeze()
    assert len(buffer) == 0 and len(data) == 2305
    assert data.read() == b"a" + b"b" * 300 + b"ccc" + b"d" * 2000 + b"e"
    buffer.write(b"again")
    assert len(buffer) == 5 and buffer.freeze().read() == b"again"


def test_a_strided_view_is_written_as_its_bytes() -> None:
    buffer = Buffer()
    assert buffer.write(memoryview(b"abcdef")[::2]) == 3
    assert buffer.freeze().read() == b"ace"


def test_a_frozen_buffer_reads_from_the_front() -> None:
    data = frozen(b"hello", b" world" * 100)
    assert data.read(5) == b"hello" and len(data) == 600
    into = bytearray(6)
    assert data.readinto(into) == 6 and into == bytearray(b" world")
    assert len(data) == 594
    assert data.read(0) == b" world" * 99 and len(data) == 0  # 0: all of it, as upstream's
    assert data.read() == b"" and data.read(10) == b""


@pytest.mark.ours_only  # upstream 0.7.0's readline returns the whole rest (a bug)
def test_readline_reads_one_line() -> None:
    data = frozen(b"l1\nl2\nl3")
    assert data.readline() == b"l1\n"
    assert data.readline(1) == b"l" and data.readline() == b"2\n"
    assert data.readline(0) == b""
    assert data.readline() == b"l3" and data.readline() == b""


@pytest.mark.ours_only  # upstream 0.7.0's fails (BufferError) where less remains than fits
def test_readinto_copies_what_remains() -> None:
    data = frozen(b"ab")
    into = bytearray(5)
    assert data.readinto(into) == 2 and into == bytearray(b"ab\0\0\0")
    assert data.readinto(into) == 0


def test_str_lists_the_unread_bytes() -> None:
    data = frozen(b"abc")
    data.read(1)
    assert str(data) == "[98, 99]"


def test_refused_as_upstream() -> None:
    with pytest.raises(TypeError, match="a bytes-like object is required, not 'str'"):
        Buffer().write("text")
    with pytest.raises(TypeError, match=r"cannot create .*FrozenBuffer' instances"):
        FrozenBuffer()
    for value in (Buffer(), frozen(b"x")):
        with pytest.raises(TypeError, match=f"cannot pickle '.*buffers.{type(value).__name__}'"):
            pickle.dumps(value)
    assert Buffer.__module__ == "monarch._rust_bindings.monarch_hyperactor.buffers"


def test_a_pickle_written_into_a_buffer_keeps_large_bytes_as_they_are() -> None:
    """What upstream's messages do: the pickler hands a large payload to ``write`` whole
    (CPython's, from 64 KiB), and the buffer keeps it rather than copying it in."""
    blob = bytes(range(256)) * 1024
    value = {"blob": blob, "step": 3}
    buffer = Buffer()
    before = sys.getrefcount(blob)
    pickle.Pickler(buffer, protocol=5).dump(value)
    assert sys.getrefcount(blob) == before + 1
    assert pickle.loads(buffer.freeze().read()) == value


@pytest.mark.ours_only  # parts() is ours: the fragments as a writer sends them
def test_parts_are_the_fragments_with_large_bytes_by_reference() -> None:
    blob = b"x" * 1000
    buffer = Buffer()
    for data in (b"a", b"b", blob, b"c"):
        buffer.write(data)
    parts = buffer.parts()
    assert [bytes(p) for p in parts] == [b"ab", blob, b"c"] and parts[1] is blob
    assert len(buffer) == 1003


@given(st.lists(st.binary(max_size=600), max_size=12), st.integers(0, 700))
def test_frozen_is_the_writes_joined(writes: list[bytes], threshold: int) -> None:
    with configured(small_write_threshold=threshold):
        buffer = Buffer()
        for data in writes:
            buffer.write(data)
        assert len(buffer) == sum(map(len, writes))
        assert buffer.freeze().read() == b"".join(writes)
