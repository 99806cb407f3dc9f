"""Upstream's ``Buffer`` and ``FrozenBuffer`` (``monarch._rust_bindings...buffers``).

A ``Buffer`` is a file to write a message into (a pickler's ``write``) that copies small writes
into one pending ``bytearray`` and keeps ``bytes`` of ``small_write_threshold`` (read when the
buffer is made, 256 by default) or more as references: the pickler hands a large ``bytes``
over whole (CPython's pickler writes payloads of 64 KiB or more straight to its file), so it is
never copied into the stream. Other large exporters (a ``bytearray``, a ``memoryview``) are
copied at the write, as upstream's are: the caller may change them afterwards. ``parts()``
(ours) gives the fragments as they are, the references among them: ``_serialize`` pickles
every message into a ``Buffer`` and sends them as separate frame parts. ``freeze()`` joins
them into one ``FrozenBuffer`` to read.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from monarch.core._config import current_config

_HOME: Final = "monarch._rust_bindings.monarch_hyperactor.buffers"
"""Where users import these classes from (and the name in upstream's messages)."""


def _no_pickle(obj: object) -> NoReturn:
    raise TypeError(f"cannot pickle '{_HOME}.{type(obj).__name__}' object")


class Buffer:
    """Bytes written in pieces: small ones copied together, large ``bytes`` kept as they are."""

    __slots__ = ("_length", "_parts", "_pending", "_threshold")

    def __init__(self) -> None:
        self._parts: list[bytes | bytearray] = []
        self._pending = bytearray()
        self._length = 0
        self._threshold = current_config().small_write_threshold

    def write(self, buff: Any) -> int:
        """Add ``buff`` (any buffer-protocol object); returns its length in bytes."""
        if isinstance(buff, bytes):
            size = len(buff)
            if size >= self._threshold:
                self._close_pending()
                self._parts.append(buff)  # immutable: a reference, never a copy
                self._length += size
                return size
            self._pending += buff
        else:
            view = memoryview(buff)  # TypeError for what is not a buffer, as upstream's
            size = view.nbytes
            self._pending += view if view.c_contiguous else view.tobytes()
        self._length += size
        return size

    def _close_pending(self) -> None:
        if self._pending:
            self._parts.append(self._pending)
            self._pending = bytearray()

    def parts(self) -> list[bytes | bytearray]:
        """The fragments written so far, in order, large ``bytes`` by reference (ours)."""
        self._close_pending()
        return list(self._parts)

    def freeze(self) -> FrozenBuffer:
        """Everything written, as one ``FrozenBuffer``; this buffer is empty afterwards.
        Joining the fragments copies them, except a buffer that holds one."""
        parts = self.parts()
        self._parts, self._length = [], 0
        data = parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)
        frozen = FrozenBuffer.__new__(FrozenBuffer)
        frozen._data, frozen._at = memoryview(data), 0
        return frozen

    def __len__(self) -> int:
        return self._length

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _no_pickle(self)


class FrozenBuffer:
    """The read-only bytes of a frozen ``Buffer``, read from the front like a file."""

    __slots__ = ("_at", "_data")
    _data: memoryview
    _at: int

    def __init__(self) -> None:
        raise TypeError(f"cannot create '{_HOME}.FrozenBuffer' instances")

    def _take(self, size: int) -> bytes:
        end = len(self._data) if size <= 0 else min(len(self._data), self._at + size)
        out = self._data[self._at : end].tobytes()
        self._at = end
        return out

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes, consumed; all that remain when ``size`` is 0 or less, as
        upstream's (a file would read nothing for 0)."""
        return self._take(size)

    def readline(self, size: int = -1) -> bytes:
        """Bytes up to and including the next newline, at most ``size`` of them, consumed."""
        rest = self._data[self._at :]
        limit = len(rest) if size < 0 else min(size, len(rest))
        newline = rest[:limit].tobytes().find(b"\n")
        return self._take(limit if newline < 0 else newline + 1) if limit else b""

    def readinto(self, b: Any) -> int:
        """Copy what remains into ``b``, as much as fits; returns the bytes copied."""
        target = memoryview(b).cast("B")
        size = min(len(target), len(self._data) - self._at)
        target[:size] = self._data[self._at : self._at + size]
        self._at += size
        return size

    def __buffer__(self, flags: int, /) -> memoryview:
        """The unread bytes, read-only, without a copy (Python 3.12 and later)."""
        return self._data[self._at :]

    def __len__(self) -> int:
        return len(self._data) - self._at

    def __str__(self) -> str:
        return str(list(self._data[self._at :].tobytes()))

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        _no_pickle(self)


Buffer.__module__ = FrozenBuffer.__module__ = _HOME
