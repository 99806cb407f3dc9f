"""Large receive buffers: not zero-filled, and on huge pages.

``bytearray(n)`` writes n zeros before the socket writes the frame over them: the whole
buffer is faulted in (and counted in the process's memory) at once, even if the peer
never sends more than the header, and it is faulted in 4 KiB pages, as the huge-page
advice can only come after. Here a large buffer is a bytearray made without zeroing
(``PyByteArray_FromStringAndSize(NULL, n)``: large allocations are fresh anonymous
memory from the kernel), advised to use transparent huge pages before it is first
touched: pages are faulted in as the bytes arrive, 512 times less often. Its content is
undefined until the caller has filled it. CPython on Linux; elsewhere (or if the kernel
says no) it is a plain zero-filled bytearray, which works the same.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

HUGE_PAGE: Final = 2 * 1024 * 1024
_MADV_HUGEPAGE: Final = 14


@cache
def _bind() -> Any:
    """ctypes, libc's madvise and CPython's bytearray constructor, loaded at the first
    large frame (not at import)."""
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    new_bytearray.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    new_bytearray.restype = ctypes.py_object
    return ctypes, madvise, new_bytearray


def fresh_bytearray(size: int) -> bytearray:
    """A bytearray of ``size`` bytes for the caller to fill; undefined content until then."""
    bound = _bind()
    if bound is None:
        return bytearray(size)
    ctypes, madvise, new_bytearray = bound
    buffer: bytearray = new_bytearray(None, size)
    if size < 2 * HUGE_PAGE:
        return buffer
    base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    start = (base + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    end = (base + size) & ~(HUGE_PAGE - 1)
    if end > start:
        madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: any answer will do
    return buffer
