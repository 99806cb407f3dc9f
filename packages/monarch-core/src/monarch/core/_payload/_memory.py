"""Large buffers in this process's memory: where they are, and fresh ones fast to fill;
and the process's own memory moved onto huge pages (a zygote's, before it forks).

Filling a fresh 128 MiB allocation costs more in page faults (4 KiB at a time) than the
copy itself; memory advised to use transparent huge pages before it is first touched
faults 512 times less often. Used where large payloads land: a buffer read from another
process (``_lending``) and a ``bytes`` unpickled from a received frame (``_serialize``).
CPython on Linux; elsewhere these fall back to plain allocations. The advice itself
(``madvise``) is the transport's, whose frames land in such buffers too
(``monarch.transport.lowlevel``); re-exported here for the core's modules.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Final

from monarch.transport import Buffer
from monarch.transport.lowlevel import (
    HUGE_PAGE,
    advise_huge_pages,
    collapse_to_huge_pages,
    whole_huge_pages,
)
from monarch.transport.lowlevel import fresh_bytearray as unspared_bytearray

__all__ = [
    "HUGE_PAGE",
    "address_of",
    "advise_huge_pages",
    "anonymous_memory",
    "available",
    "collapse_to_huge_pages",
    "copy_into",
    "copy_to_bytes",
    "fresh_bytearray",
    "fresh_bytes",
    "whole_huge_pages",
]


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


def _bind() -> tuple[Any, Any, Any] | None:
    try:
        api = ctypes.pythonapi
        get, release = api.PyObject_GetBuffer, api.PyBuffer_Release
        new_bytes = api.PyBytes_FromStringAndSize
    except AttributeError:  # not CPython
        return None
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    get.restype = ctypes.c_int
    release.argtypes = [ctypes.POINTER(_PyBuffer)]
    release.restype = None
    new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    new_bytes.restype = ctypes.py_object
    return get, release, new_bytes


_api = _bind()


def available() -> bool:
    return _api is not None


def address_of(buffer: Buffer) -> int:
    """Where a buffer's bytes start in this process's memory."""
    assert _api is not None
    get, release, _ = _api
    view = _PyBuffer()
    get(buffer, ctypes.byref(view), 0)
    try:
        return int(view.buf or 0)
    finally:
        release(ctypes.byref(view))


def anonymous_memory(piece: int) -> list[tuple[int, int]]:
    """This process's private writable anonymous memory (its heaps, Python's arenas,
    what libraries allocated), as ``(start, end)`` pieces of whole huge pages, at most
    ``piece`` bytes each: what ``collapse_to_huge_pages`` can take, a piece at a time."""
    pieces: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.readlines()
    except OSError:  # not Linux
        return pieces
    for line in lines:
        fields = line.split()
        path = fields[5] if len(fields) > 5 else ""
        if fields[1][1] != "w" or fields[1][3] != "p" or path not in ("", "[heap]"):
            continue
        low, _, high = fields[0].partition("-")
        start, end = whole_huge_pages(int(low, 16), int(high, 16))
        pieces.extend((at, min(at + piece, end)) for at in range(start, end, piece))
    return pieces


def fresh_bytes(size: int) -> bytes:
    """A ``bytes`` of ``size`` bytes for the caller to fill before anyone else sees it (a
    ``bytes`` is immutable once shared); its content is undefined until then.

    A large one comes from ``_spares`` when one of that size is no longer used by anyone
    (a fresh allocation's pages must be faulted in and zeroed by the kernel first, which
    costs as much as the copy), else it is new, on huge pages.
    """
    assert _api is not None
    data: bytes | None = _spares.take(size) if size >= SPARE_MIN else None
    if data is None:
        data = _api[2](None, size)
        advise_huge_pages(address_of(data), size)
        if size >= SPARE_MIN:
            _spares.keep(data)
    return data


SPARE_MIN: Final = 16 * 1024 * 1024
"""``bytes`` and ``bytearray`` from this size are kept for reuse once their user lets go of
them (one list of each)."""
SPARES: Final = 2
SPARE_BYTES_MAX: Final = 128 * 1024 * 1024
"""A spare larger than this is not kept (the memory is given back): a process holds at
most SPARES of each kind once nobody uses them, 512 MiB in all."""


class _Spares:
    """The last large buffers made by ``fresh_bytes`` (or ``fresh_bytearray``), reused once
    unreferenced.

    Reusing one is safe only when nothing else holds it (its reference count says so:
    nobody can make a new reference without one; a memoryview or a tensor built on it
    holds one). Reusing a ``bytes`` means writing into an immutable object, so its cached
    hash is cleared too; where the object layout is not the one checked at start (another
    Python), ``bytes`` spares are off.
    """

    def __init__(self, kind: type[bytes] | type[bytearray]) -> None:
        self._spares: list[Any] = []
        self._hash_at = self._find_hash_field() if kind is bytes else None
        self._on = kind is bytearray or self._hash_at is not None

    @staticmethod
    def _find_hash_field() -> int | None:
        if sys.implementation.name != "cpython":
            return None
        at = sys.getsizeof(b"") - 1 - ctypes.sizeof(ctypes.c_ssize_t)  # just before the data
        probe = bytes(range(64))
        field = ctypes.c_ssize_t.from_address(id(probe) + at)
        if field.value != -1:
            return None
        computed = hash(probe)  # fills the field in
        return at if field.value == computed else None

    def take(self, size: int) -> Any:
        if not self._on:
            return None
        spares = self._spares
        for i in range(len(spares)):
            spare = spares[i]
            # References: the list, ``spare``, getrefcount's argument; no user's.
            if len(spare) == size and sys.getrefcount(spare) == 3:
                del spares[i]
                if self._hash_at is not None:
                    ctypes.c_ssize_t.from_address(id(spare) + self._hash_at).value = -1
                spares.append(spare)  # most recently used last
                return spare
        return None

    def keep(self, data: bytes | bytearray) -> None:
        if not self._on or len(data) > SPARE_BYTES_MAX:
            return
        self._spares = [*self._spares[-(SPARES - 1) :], data] if SPARES > 1 else [data]


_spares = _Spares(bytes)
_spare_bytearrays = _Spares(bytearray)


def fresh_bytearray(size: int) -> bytearray:
    """A ``bytearray`` of ``size`` bytes for the caller to fill; its content is undefined
    until then. ``bytearray(size)`` would zero it first: a pass over memory (and all its
    page faults) that the fill repeats."""
    if _api is None:
        return bytearray(size)
    spare: bytearray | None = _spare_bytearrays.take(size) if size >= SPARE_MIN else None
    if spare is not None:
        return spare
    data = unspared_bytearray(size)
    if size >= SPARE_MIN:
        _spare_bytearrays.keep(data)
    return data


def copy_into(target: Buffer, source: Buffer) -> None:
    """``target[:] = source`` for buffers of one size, without the checks and the GIL."""
    size = memoryview(source).nbytes
    if memoryview(target).nbytes != size:
        raise ValueError("copy_into needs buffers of one size")
    if _api is None:
        memoryview(target).cast("B")[:] = memoryview(source).cast("B")
    elif size:
        ctypes.memmove(address_of(target), address_of(source), size)


def copy_to_bytes(view: memoryview) -> bytes:
    """``bytes(view)``, into memory on huge pages when large."""
    size = view.nbytes
    if _api is None or size < 2 * HUGE_PAGE:
        return bytes(view)
    data = fresh_bytes(size)
    copy_into(data, view)
    return data
