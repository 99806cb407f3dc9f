"""The write gate: lets a peer of this host write a loan straight into its lender's memory.

A reader can tell by itself that a copy overlapped a drop (it checks the loan's liveness
cell after copying) and throw the bytes away. A writer cannot undo a write: bytes written
after the lender dropped the loan, and perhaps freed or reused its memory, are damage.
So a writer holds the loan's *gate* while it checks the cell and writes, and the lender,
once it has cleared the cell, closes the gate before it lets go of the memory:

- the lender keeps an anonymous file (``memfd_create``) open; a loan's gate is the byte
  at its id in that file. A writer opens the file through ``/proc/PID/fd/N`` (the same
  permission as reading the lender's memory) and takes a shared open-file-description
  lock on that byte (``F_OFD_SETLKW``) for the whole check-and-write;
- a drop clears the cell, then takes the byte exclusively and lets go at once: that waits
  for every writer that holds it, and every writer that takes it afterwards finds the
  cell cleared (the kernel's lock orders the two) and writes nothing.

The kernel keeps the locks, so a writer that dies lets go of its gate with its files, and
the lender's file dies with the lender: no cleanup, no stale state. Several threads of one
writer may write the same loan at once: they share one lock, counted here, since
locks of one open file description on one byte are one lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from monarch.core._errors import PullError

_FLOCK: Final = struct.Struct("hhqqi")
"""``struct flock`` (native layout): type, whence, start, length, pid."""
_SETLKW: Final = getattr(fcntl, "F_OFD_SETLKW", None)
_SETLK: Final = getattr(fcntl, "F_OFD_SETLK", None)
_GETLK: Final = getattr(fcntl, "F_OFD_GETLK", None)
PAUSE_MIN: Final = 0.0005
PAUSE_MAX: Final = 0.05
"""How often a drop with a deadline tries the gate again (doubling from the first)."""
OPEN_MAX: Final = 256
"""Lenders' gate files a writer keeps open; beyond, the oldest is closed."""


def available() -> bool:
    """Whether this system has open-file-description locks and anonymous files (Linux)."""
    return _SETLKW is not None and hasattr(os, "memfd_create")


def _lock(fd: int, kind: int, at: int, wait: bool = True) -> bool:
    command = _SETLKW if wait else _SETLK
    assert command is not None
    try:
        fcntl.fcntl(fd, command, _FLOCK.pack(kind, os.SEEK_SET, at, 1, 0))
    except OSError as error:
        if not wait and error.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class Gate:
    """The lender's side: one file whose bytes are its loans' gates."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.fd = os.memfd_create("monarch-write-gate", os.MFD_CLOEXEC) if available() else -1

    def busy(self, loan_id: int) -> bool:
        """Whether a writer holds ``loan_id``'s gate now (a hint: it may let go at once)."""
        if self.fd < 0 or _GETLK is None:
            return False
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, loan_id, 1, 0)
        kind = _FLOCK.unpack(fcntl.fcntl(self.fd, _GETLK, probe))[0]
        return bool(kind != fcntl.F_UNLCK)

    def close(self, loan_id: int, deadline: float | None = None) -> bool:
        """Wait until no writer holds ``loan_id``'s gate (call it once its cell is
        cleared: no writer takes it afterwards and still writes); False if one still
        holds it at ``deadline`` (``time.monotonic()``; None: no deadline), a writer
        stopped mid-write: the memory may still be written."""
        if self.fd < 0:
            return True
        if deadline is None:
            _lock(self.fd, fcntl.F_WRLCK, loan_id)
        else:
            pause = PAUSE_MIN
            while not _lock(self.fd, fcntl.F_WRLCK, loan_id, wait=False):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(pause, left))  # nothing to wait on but the lock itself
                pause = min(2 * pause, PAUSE_MAX)
        _lock(self.fd, fcntl.F_UNLCK, loan_id)
        return True


class _Opened:
    """A lender's gate file opened here, and how many of our threads hold each gate."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.held: dict[int, int] = {}


_opened: dict[tuple[int, int, int], _Opened] = {}
_lock_opened = threading.Lock()


def _forget_all_in_child() -> None:
    """A forked child shares its parent's open file descriptions, and so their locks:
    it opens the gates it writes through afresh."""
    global _lock_opened
    _lock_opened = threading.Lock()
    for opened in _opened.values():
        os.close(opened.fd)  # not the last reference: the parent's locks stay
    _opened.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)


def _open(pid: int, gate: int, token: int) -> _Opened:
    key = (pid, gate, token)
    with _lock_opened:
        found = _opened.get(key)
        if found is not None:
            return found
    try:
        fd = os.open(f"/proc/{pid}/fd/{gate}", os.O_RDWR | os.O_CLOEXEC)
    except OSError as error:
        code = error.errno or errno.EIO
        raise PullError(code, f"cannot open the write gate of process {pid}: {error}") from None
    with _lock_opened:
        found = _opened.get(key)
        if found is not None:
            os.close(fd)
            return found
        if len(_opened) >= OPEN_MAX:
            _forget_idle()
        opened = _opened[key] = _Opened(fd)
        return opened


def _forget_idle() -> None:
    """Close the gate files no thread holds a gate of (under ``_lock_opened``)."""
    for key, opened in list(_opened.items()):
        if not opened.held:
            del _opened[key]
            os.close(opened.fd)


@contextmanager
def holding(pid: int, gate: int, token: int, loan_id: int) -> Iterator[None]:
    """Hold loan ``loan_id``'s gate in process ``pid`` (gate file ``gate``, lender token
    ``token``) for the block: its lender's drop waits until the block ends. The caller
    checks the loan's cell inside the block, before writing."""
    opened = _open(pid, gate, token)
    with _lock_opened:
        count = opened.held.get(loan_id, 0)
        opened.held[loan_id] = count + 1
        if count == 0:  # under the lock: a thread that finds count > 0 finds it held
            _lock(opened.fd, fcntl.F_RDLCK, loan_id)
    try:
        yield
    finally:
        with _lock_opened:
            count = opened.held[loan_id] - 1
            if count:
                opened.held[loan_id] = count
            else:
                del opened.held[loan_id]
                _lock(opened.fd, fcntl.F_UNLCK, loan_id)
