"""The same-host memory plane: processes of one machine copy straight from each other.

Through a socket, a large buffer is copied into the kernel by its sender and out again
by its receiver. Between processes of one machine that may read each other's memory
(``process_vm_readv``: same user, no ptrace restriction in the way) the reader copies it
out of its owner instead, once. Both kinds of loan go this way: the large parts of actor
messages (``_lending``) and ``RDMABuffer`` regions (monarch-rdma).

Two checks say a copy may be trusted, the one implementation of each:

- ``is_peer``: the process with that pid is the lender we think (it holds the bytes we
  expect at an address it told us: a runtime's incarnation token, an ``RDMABuffer``
  registry's identity cell), and we may read it. Tested once per (pid, address, bytes).
- ``check_live``: the loan is still lent: its *cell* in the lender holds (token, id),
  the id zeroed once it is dropped. A reader checks it before and after copying; a copy
  that a drop overlapped is refused, never returned as data. (A message part needs no
  cell: its lender keeps it until the borrower gives it back.)

A write cannot be refused after the fact: bytes that land once the region was dropped
(and its memory perhaps reused) are damage. Where the lender has a *write gate*
(``_write_gate``: a drop waits for the writers that hold it) the writer holds the loan's
gate, checks its cell and writes straight into the lender's memory (``write_range``,
``process_vm_writev``: exactly the bytes written, nothing around them). Without one, this
plane does not write (``write`` is False): the writer asks the owner, and the owner reads
the writer's memory into its region (``pull_into``), so the owner's memory is only written
by itself, which knows the region is lent while it writes. Asking a proc is the runtime's,
a wing above this one, and what a write asks (the region, by its id) the lender's wheel's:
that wheel registers a plane of its own that writes so, through the entry points as every
plane (monarch-rdma's ``pull``: this plane, its ``write`` asking the owner's ``rdma``
service); ``Planes.write`` asks it next.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable
from typing import Any, ClassVar, Final

from monarch.core._config import current_config
from monarch.core._errors import PullError
from monarch.core._payload import _memory as memory

from . import _write_gate as write_gate
from ._executor import bulk_executor
from ._plane import Loan, LoanDropped, LoanLost, Plane

CELL: Final = struct.Struct("<QQ")
"""An identity cell (magic, token) or a loan's liveness cell (token, id)."""
SPLIT_MIN: Final = 8 * 1024 * 1024
"""Reads from this size are shared among threads..."""
SPLIT_MAX: Final = 4
"""...at most this many (fewer on a machine with fewer cores)..."""
PIECE: Final = 4 * 1024 * 1024
"""...which take it in pieces of this size (huge-page aligned)."""


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _bind(name: str = "process_vm_readv") -> Any:
    try:
        readv = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):  # not Linux/glibc
        return None
    readv.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    readv.restype = ctypes.c_ssize_t
    return readv


_readv = _bind() if memory.available() else None
_writev = _bind("process_vm_writev") if memory.available() else None


def available() -> bool:
    """Whether this process can read another's memory at all (Linux, glibc)."""
    return _readv is not None


def read_range(pid: int, base: int, address: int, size: int) -> None:
    """Read ``size`` bytes at ``address`` in process ``pid`` into ``base`` (an address of
    ours); ``PullError`` if that process is gone or its memory there cannot be read.

    A large read is split among threads (``bulk_executor().spread``): the kernel copies
    each page after pinning it, and one thread pinning 4 KiB pages moves about a third of
    what memcpy does; two side by side, about half (ctypes lets go of the GIL for each).
    Pieces are taken from one iterator by every reader (its ``next`` is atomic): a reader
    that gets less CPU takes fewer of them, and the read ends when the last piece does."""
    _copy(_read, pid, base, address, size)


def write_range(pid: int, base: int, address: int, size: int) -> None:
    """Write ``size`` bytes at ``base`` (ours) to ``address`` in process ``pid``, split
    among threads as ``read_range``; ``PullError`` if that memory cannot be written. Only
    under the loan's write gate (``_write_gate``): a write cannot be taken back."""
    _copy(_write, pid, base, address, size)


def _copy(
    move: Callable[[int, int, int, int], None], pid: int, base: int, address: int, size: int
) -> None:
    """``move`` the range, split among threads when large (see ``read_range``)."""
    readers = _readers_for(size)
    if readers == 1:
        move(pid, base, address, size)
        return
    pieces = iter(_pieces(size))

    def move_pieces() -> None:
        for start, length in pieces:
            move(pid, base + start, address + start, length)

    errors = bulk_executor().spread(move_pieces, readers - 1)
    if errors:
        raise errors[0]


def _readers_for(size: int) -> int:
    """How many threads read ``size`` bytes: as many as the cores (up to SPLIT_MAX), one
    when small."""
    if size < SPLIT_MIN:
        return 1
    return min(SPLIT_MAX, os.cpu_count() or 1)


def _pieces(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the PIECE-sized pieces that cover ``size`` bytes, in order."""
    return [(start, min(PIECE, size - start)) for start in range(0, size, PIECE)]


def _read(pid: int, local: int, remote: int, size: int) -> None:
    _vm(_readv, "read", pid, local, remote, size)


def _write(pid: int, local: int, remote: int, size: int) -> None:
    _vm(_writev, "write", pid, local, remote, size)


def _vm(call: Any, what: str, pid: int, local: int, remote: int, size: int) -> None:
    if call is None:
        raise PullError(errno.ENOSYS, f"this system cannot {what} another process's memory")
    done = 0
    while done < size:
        here = _IoVec(local + done, size - done)
        there = _IoVec(remote + done, size - done)
        got = call(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if got <= 0:
            code = ctypes.get_errno()
            why = os.strerror(code)
            raise PullError(code, f"cannot {what} {size} bytes of process {pid}: {why}")
        done += got


_peers: dict[tuple[int, int, bytes], bool] = {}
"""Whether (pid, address, expected bytes) was found: tested once each."""


def is_peer(pid: int, address: int, expected: bytes) -> bool:
    """Whether process ``pid`` holds ``expected`` at ``address`` and we may read it (not
    ourselves: we copy our own memory directly)."""
    if _readv is None or pid == os.getpid():
        return False
    key = (pid, address, expected)
    known = _peers.get(key)
    if known is None:
        into = bytearray(len(expected))
        try:
            _read(pid, memory.address_of(into), address, len(expected))
            known = bytes(into) == expected
        except (PullError, OverflowError):
            known = False
        _peers[key] = known
    return known


def read_cell(pid: int, address: int) -> tuple[int, int]:
    """The two words of a cell of process ``pid``."""
    into = bytearray(CELL.size)
    read_range(pid, memory.address_of(into), address, CELL.size)
    first, second = CELL.unpack(into)
    return first, second


def check_live(loan: Loan) -> None:
    """``LoanLost`` if the lender is gone, ``LoanDropped`` if the loan was given back."""
    try:
        token, buffer_id = read_cell(loan.pid, loan.cell)
    except PullError as error:
        if error.errno == errno.ESRCH:
            raise LoanLost(error.errno, f"process {loan.pid} is gone") from None
        raise
    if token != loan.token:
        raise LoanLost(errno.ESRCH, f"process {loan.pid} is gone (its pid was reused)")
    if buffer_id != loan.buffer_id:
        raise LoanDropped(0, f"the region of process {loan.pid} was dropped")


def enabled() -> bool:
    """Whether peers' memory is read at all (``read_peer_buffers``, on by default)."""
    return _readv is not None and current_config().read_peer_buffers


IDENTITY_MAGIC: Final = int.from_bytes(b"monarchR", "little")


def identity_of(token: int) -> bytes:
    """What an identity cell holding ``token`` reads as."""
    return CELL.pack(IDENTITY_MAGIC, token)


class MemoryPlane(Plane):
    """Copies between processes of this host (see the module docstring)."""

    name: ClassVar[str] = "memory"
    order: ClassVar[int] = 10
    reads_alone: ClassVar[bool] = True

    def writes_alone(self, loan: Loan) -> bool:
        return _writes_direct(loan)

    def reaches(self, loan: Loan) -> bool:
        return enabled() and is_peer(loan.pid, loan.identity, identity_of(loan.token))

    def read(self, loan: Loan, into: int, deadline: float) -> None:
        check_live(loan)
        try:
            read_range(loan.pid, into, loan.address, loan.size)
        except PullError:
            check_live(loan)  # a drop or a death explains it better
            raise
        check_live(loan)  # a drop during the copy: the bytes may be anyone's

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        if _writes_direct(loan):
            write_into(loan, source, size)
            return True
        return False  # no write gate: the owner pulls, asked by its wheel's plane (above)


def _writes_direct(loan: Loan) -> bool:
    """Whether we write ``loan`` straight into its lender (it has a write gate)."""
    return loan.gate >= 0 and _writev is not None and write_gate.available()


def write_into(loan: Loan, source: int, size: int) -> None:
    """Write ``size`` bytes at ``source`` (ours) to the start of ``loan``, straight into
    its lender's memory: under the loan's write gate, once its cell says it is still lent
    (a drop waits for the gate, so the memory stays the loan's until the write ends)."""
    try:
        with write_gate.holding(loan.pid, loan.gate, loan.token, loan.buffer_id):
            check_live(loan)
            write_range(loan.pid, source, loan.address, size)
    except PullError:
        check_live(loan)  # a death explains it better
        raise


def pull_into(target: int, pid: int, identity: int, token: int, address: int, size: int) -> bool:
    """On the owner: copy ``size`` bytes at ``address`` of the writer ``pid`` to ``target``;
    False if we cannot read that writer (it then writes another way)."""
    if not enabled() or not is_peer(pid, identity, identity_of(token)):
        return False
    read_range(pid, target, address, size)
    return True
