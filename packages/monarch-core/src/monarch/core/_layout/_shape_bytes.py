"""Upstream's byte form of an ``Extent`` and a ``Point``: ``Extent/Point.from_bytes``.

Upstream 0.7.0 pickles both as ``from_bytes(bincode)``: little-endian u64 counts and values,
labels as u64 length + UTF-8. An extent is ``labels, sizes``; a point is ``rank, extent``.
Bytes after the value are ignored, as bincode does. Malformed input raises ``ValueError``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

_U64 = struct.Struct("<Q")


class _Reader:
    """Reads bincode's fixed-width fields from bytes, refusing to run past the end."""

    def __init__(self, data: bytes) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"argument 'bytes': {type(data).__name__!r} object is not bytes")
        self._data = bytes(data)
        self._at = 0

    def _take(self, count: int) -> bytes:
        end = self._at + count
        if end > len(self._data):
            raise ValueError(f"UnexpectedEnd {{ additional: {end - len(self._data)} }}")
        chunk = self._data[self._at : end]
        self._at = end
        return chunk

    def u64(self) -> int:
        value: int = _U64.unpack(self._take(_U64.size))[0]
        return value

    def text(self) -> str:
        raw = self._take(self.u64())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"Utf8 {{ {error} }}: a label is not UTF-8") from None

    def extent(self) -> tuple[list[str], list[int]]:
        labels = [self.text() for _ in range(self.u64())]
        sizes = [self.u64() for _ in range(self.u64())]
        return labels, sizes


def encode_extent(labels: Sequence[str], sizes: Sequence[int]) -> bytes:
    """The bytes ``Extent.from_bytes`` reads back as ``Extent(labels, sizes)``."""
    parts = [_U64.pack(len(labels))]
    for label in labels:
        raw = label.encode("utf-8")
        parts += [_U64.pack(len(raw)), raw]
    parts.append(_U64.pack(len(sizes)))
    parts += [_U64.pack(size) for size in sizes]
    return b"".join(parts)


def encode_point(rank: int, labels: Sequence[str], sizes: Sequence[int]) -> bytes:
    """The bytes ``Point.from_bytes`` reads back as the point ``rank`` of that extent."""
    return _U64.pack(rank) + encode_extent(labels, sizes)


def decode_extent(data: bytes) -> tuple[list[str], list[int]]:
    """``(labels, sizes)`` of an extent's bytes."""
    return _Reader(data).extent()


def decode_point(data: bytes) -> tuple[int, list[str], list[int]]:
    """``(rank, labels, sizes)`` of a point's bytes."""
    reader = _Reader(data)
    rank = reader.u64()
    labels, sizes = reader.extent()
    return rank, labels, sizes
