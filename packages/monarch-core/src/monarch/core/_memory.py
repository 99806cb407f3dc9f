"""Large buffers in this process's memory: where they are, and fresh ones fast to fill.

Filling a fresh 128 MiB allocation costs more in page faults (4 KiB at a time) than the
copy itself; memory advised to use transparent huge pages before it is first touched
faults 512 times less often. Used where large payloads land: a buffer read from another
process (``_lending``) and a ``bytes`` unpickled from a received frame (``_serialize``).
CPython on Linux; elsewhere these fall back to plain allocations.
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

from monarch.transport import Buffer

HUGE_PAGE: Final = 2 * 1024 * 1024
_MADV_HUGEPAGE: Final = 14


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


def _bind() -> tuple[Any, Any, Any, Any] | None:
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        api = ctypes.pythonapi
        get, release = api.PyObject_GetBuffer, api.PyBuffer_Release
        new_bytes = api.PyBytes_FromStringAndSize
    except (OSError, AttributeError):  # not Linux/glibc, or not CPython
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    get.restype = ctypes.c_int
    release.argtypes = [ctypes.POINTER(_PyBuffer)]
    release.restype = None
    new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    new_bytes.restype = ctypes.py_object
    return madvise, get, release, new_bytes


_api = _bind()


def available() -> bool:
    return _api is not None


def address_of(buffer: Buffer) -> int:
    """Where a buffer's bytes start in this process's memory."""
    assert _api is not None
    _, get, release, _ = _api
    view = _PyBuffer()
    get(buffer, ctypes.byref(view), 0)
    try:
        return int(view.buf or 0)
    finally:
        release(ctypes.byref(view))


def advise_huge_pages(base: int, size: int) -> None:
    """Ask for huge pages under ``size`` bytes at ``base`` (advice: failure changes nothing)."""
    if _api is None or size < 2 * HUGE_PAGE:
        return
    start = (base + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    end = (base + size) & ~(HUGE_PAGE - 1)
    if end > start:
        _api[0](start, end - start, _MADV_HUGEPAGE)


def fresh_bytes(size: int) -> bytes:
    """A new ``bytes`` of ``size`` bytes, not yet filled, on huge pages when large.

    Only for the caller to fill before anyone else sees it (a ``bytes`` is immutable
    once shared); its content is undefined until then.
    """
    assert _api is not None
    data: bytes = _api[3](None, size)
    advise_huge_pages(address_of(data), size)
    return data


def fresh_bytearray(size: int) -> bytearray:
    data = bytearray(size)
    if _api is not None:
        advise_huge_pages(address_of(data), size)
    return data


def copy_to_bytes(view: memoryview) -> bytes:
    """``bytes(view)``, into memory on huge pages when large."""
    size = view.nbytes
    if _api is None or size < 2 * HUGE_PAGE:
        return bytes(view)
    data = fresh_bytes(size)
    ctypes.memmove(address_of(data), address_of(view), size)
    return data
