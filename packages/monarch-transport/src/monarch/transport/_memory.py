"""This process's memory advice (libc's ``madvise``) and large buffers made without
zeroing: the one binding of them every layer uses (the core's payloads and its zygote's
heap build on it, see ``monarch.core._payload._memory``).

``bytearray(n)`` writes n zeros before the socket writes the frame over them: the whole
buffer is faulted in (and counted in the process's memory) at once, even if the peer
never sends more than the header, and it is faulted in 4 KiB pages, as the huge-page
advice can only come after. Here a large buffer is a bytearray made without zeroing
(``PyByteArray_FromStringAndSize(NULL, n)``: large allocations are fresh anonymous
memory from the kernel), advised to use transparent huge pages before it is first
touched: pages are faulted in as the bytes arrive, 512 times less often. Its content is
undefined until the caller has filled it. CPython on Linux; elsewhere (or if the kernel
says no) it is a plain zero-filled bytearray, which works the same, and the advice does
nothing.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

HUGE_PAGE: Final = 2 * 1024 * 1024
_MADV_HUGEPAGE: Final = 14
_MADV_COLLAPSE: Final = 25


@cache
def _bind() -> Any:
    """ctypes, libc's madvise and CPython's bytearray constructor, loaded at first use
    (not at import)."""
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except (OSError, AttributeError):  # not Linux/glibc, or not CPython
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    new_bytearray.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    new_bytearray.restype = ctypes.py_object
    return ctypes, madvise, new_bytearray


def whole_huge_pages(start: int, end: int) -> tuple[int, int]:
    """The huge-page-aligned part of ``[start, end)`` (empty: ``end <= start``)."""
    return (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), end & ~(HUGE_PAGE - 1)


def advise_huge_pages(base: int, size: int) -> None:
    """Ask for huge pages under ``size`` bytes at ``base`` (advice: failure changes nothing)."""
    bound = _bind() if size >= 2 * HUGE_PAGE else None
    if bound is None:
        return
    start, end = whole_huge_pages(base, base + size)
    if end > start:
        bound[1](start, end - start, _MADV_HUGEPAGE)


def collapse_to_huge_pages(start: int, end: int) -> bool:
    """Move what ``[start, end)`` (whole huge pages, mapped) holds onto huge pages now,
    as khugepaged would some day (``MADV_COLLAPSE``, Linux 6.1). A process that forks
    then hands each child one page-table entry per 2 MiB instead of 512 to copy at the
    fork and tear down at its exit; a child's first write to one of them splits only its
    own mapping. False where it did not (an older kernel, THP off, a mapping that may not
    have them, the range unmapped since it was listed): nothing changed."""
    bound = _bind() if end > start else None
    if bound is None:
        return False
    return bool(bound[1](start, end - start, _MADV_COLLAPSE) == 0)


def fresh_bytearray(size: int) -> bytearray:
    """A bytearray of ``size`` bytes for the caller to fill; undefined content until then."""
    bound = _bind()
    if bound is None:
        return bytearray(size)
    ctypes, _, new_bytearray = bound
    buffer: bytearray = new_bytearray(None, size)
    if size >= 2 * HUGE_PAGE:
        advise_huge_pages(ctypes.addressof(ctypes.c_char.from_buffer(buffer)), size)
    return buffer
