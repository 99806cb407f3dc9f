"""A ring of shared memory through which the lender of a large buffer pushes it.

A borrower reading a lent buffer with ``process_vm_readv`` makes the kernel pin the
lender's pages one by one: from 4 KiB pages that moves about half of what memcpy does,
even with two threads. The lender copying from its own memory needs no pinning, so a
lender's thread copies the buffer, a slot at a time, into a small ring both processes
map, while the borrower copies each slot out as soon as it is full: two memcpys side
by side, close to the speed of one.

The ring only speeds a loan up. The borrower waits a little for each slot; when none
comes (the lender's thread is busy elsewhere or starved of CPU, frames arrived out of
order), it says it is done with the loan, so the lender stops pushing it, and reads the
rest itself (see ``_lending.pull``). Nothing waits on the lender's thread for long, and a
wrong guess by either side costs only a copy: slots carry which loan and piece they hold.

Layout of the shared file (a memfd the borrower opens through ``/proc/<pid>/fd``):
a header page (the ring's random id; ``head``, slots filled; ``tail``, slots emptied;
``at``, where the borrower is; each slot's loan and piece), then SLOTS slots of SLOT
bytes. ``head`` and ``tail`` are 32-bit futex words each side sleeps on. One lender
thread writes ``head`` and the slots, one borrower thread ``tail`` and ``at``.

x86-64 Linux only: the plain loads and stores that publish a slot are ordered there
(total store order); elsewhere loans are read with ``process_vm_readv`` alone.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import mmap
import os
import platform
import queue
import secrets
import struct
import threading
import time
from typing import Any, Final, Protocol

from monarch.core._payload._memory import address_of
from monarch.core._payload._per_process import PerProcess
from monarch.core._placement import unpin_this_thread

log = logging.getLogger("monarch.core.ring")

SLOT: Final = 4 * 1024 * 1024
"""Large, for few copies per loan: each lets go of the GIL and takes it back, which costs
a switch interval (5 ms) when another thread of the process keeps it busy."""
SLOTS: Final = 2
RING_MIN: Final = SLOT
"""Loans from this size are pushed through the lender's ring (smaller: read directly)."""
RINGS_MAX: Final = 8
"""Rings one process keeps at once (one per peer it lends to): at most 64 MiB shared."""
PATIENCE: Final = 0.001
"""How long the borrower waits for a slot before reading the rest itself (s)."""
PUSH_PATIENCE: Final = 0.05
"""How long the lender waits for a free slot before leaving the loan to its borrower."""
SLOW: Final = 0.002
"""A borrower that spends longer than this not running while it copies a slot (about 0.3
ms of work) waits for the GIL after each copy (another thread keeps it): it reads the rest
itself, with ``_lending``'s threads, which wait for it side by side."""

_PAGE: Final = 4096
_ID, _HEAD, _TAIL, _AT, _HEAD_WAITER, _TAIL_WAITER, _SLOT_INFO = 0, 64, 128, 192, 256, 320, 384
_TAKEN = 1024
"""Bytes of the loan the borrower was last done with (``at``) it took from the slots."""
TAKEN_START: Final = 0.02
"""How long a lender waiting to learn what its borrower took (``Ring.taken``) waits for the
borrower to start on the loan (its frame may still be on its way; a busy machine may not
run the borrower at once): then it copies the whole loan itself."""
TAKEN_STALL: Final = 0.5
"""How long it waits between two slots taken once the borrower is on the loan (a borrower
stops taking by itself when the slots do not come)."""
_INFO: Final = struct.Struct("<QQ")
SIZE: Final = _PAGE + SLOTS * SLOT

_SYS_FUTEX: Final = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class _TimeSpec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def _bind() -> Any:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    if not hasattr(os, "memfd_create"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    return syscall


_syscall = _bind()


def available() -> bool:
    return _syscall is not None


_taken = 0


def taken_bytes() -> int:
    """Bytes this process has taken from its peers' rings (what benchmarks and tests
    look at to tell the ring from the direct read)."""
    return _taken


def _wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the 32-bit word at ``address`` holds ``expected``, at most ``timeout``."""
    whole = int(timeout)
    spec = _TimeSpec(whole, int((timeout - whole) * 1e9))
    _syscall(
        _SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected),
        ctypes.byref(spec), None, 0,
    )  # fmt: skip


def _wake(address: int) -> None:
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 1, None, None, 0)


class _Mapping:
    """The shared file mapped, and its fields. Alive as long as its users hold it: the
    mapping is only let go (unmapped) when nothing can touch its addresses any more."""

    def __init__(self, fd: int) -> None:
        self.map = mmap.mmap(fd, SIZE)
        self._anchor = ctypes.c_char.from_buffer(self.map)
        base = ctypes.addressof(self._anchor)
        self.id = ctypes.c_uint64.from_address(base + _ID)
        self.head = ctypes.c_uint32.from_address(base + _HEAD)
        self.tail = ctypes.c_uint32.from_address(base + _TAIL)
        self.head_at, self.tail_at = base + _HEAD, base + _TAIL
        """Where ``head`` and ``tail`` are: the futex words."""
        self.at = ctypes.c_uint64.from_address(base + _AT)
        self.taken = ctypes.c_uint64.from_address(base + _TAKEN)
        self.head_waiter = ctypes.c_uint32.from_address(base + _HEAD_WAITER)
        self.tail_waiter = ctypes.c_uint32.from_address(base + _TAIL_WAITER)
        self.slots = base + _PAGE

    def info(self, slot: int) -> tuple[int, int]:
        """(loan, piece) of what ``slot`` holds."""
        return _INFO.unpack_from(self.map, _SLOT_INFO + slot * _INFO.size)

    def set_info(self, slot: int, loan: int, piece: int) -> None:
        _INFO.pack_into(self.map, _SLOT_INFO + slot * _INFO.size, loan, piece)


_live = 0
_live_lock = threading.Lock()


class Ring:
    """The lending side of one ring (one per peer we lend to): loans are numbered from 1,
    in the order they are queued for the pusher, which is the order they are lent in."""

    def __init__(self, fd: int, mapping: _Mapping) -> None:
        self.fd = fd
        self._mapping = mapping
        self.id = mapping.id.value
        self._loans = itertools.count(1)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.closed = False

    @classmethod
    def open(cls) -> Ring | None:
        """A new ring, or None where there is none to be had (not here, too many)."""
        global _live
        if _syscall is None:
            return None
        with _live_lock:
            if _live >= RINGS_MAX:
                return None
            _live += 1
        try:
            fd = os.memfd_create("monarch-ring", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, SIZE)
                mapping = _Mapping(fd)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            log.debug("no ring: %s", exc)
            with _live_lock:
                _live -= 1
            return None
        mapping.id.value = secrets.randbits(63) | 1
        return cls(fd, mapping)

    def push(self, view: memoryview, source: Source | None = None) -> int:
        """Queue ``view`` to be pushed; returns its loan number (what the descriptor says).
        ``source``: where its bytes are read meanwhile, if elsewhere (see ``_filling``)."""
        with self._lock:
            loan = next(self._loans)
            _pusher.get().put((self._mapping, loan, view, self, source))
        return loan

    def taken(self, loan: int) -> int:
        """Bytes of loan ``loan`` its borrower took from the slots, once it is done with
        them; 0 when that cannot be known (it did not start on the loan in time, stopped
        taking, or has moved on to a later loan). Waits while the borrower takes."""
        mapping, clock = self._mapping, time.monotonic
        at, tail, taken = mapping.at, mapping.tail, mapping.taken
        started, done = 2 * loan, 2 * loan + 1
        last, since = tail.value, clock()
        while not self.closed:
            where = at.value
            if where == done:
                count = taken.value
                if at.value == done:  # still this loan's count: written before ``at``
                    return int(count)
                continue
            if where > done:
                return 0
            now = clock()
            emptied = tail.value
            if emptied != last:
                last, since = emptied, now
            elif now - since > (TAKEN_STALL if where == started else TAKEN_START):
                return 0
            _wait(mapping.tail_at, emptied, 0.0002)
        return 0

    def filled(self) -> int:
        """Slots filled so far (modulo 2**32): how a test sees the pusher at work."""
        return self._mapping.head.value

    def close(self) -> None:
        """No more loans: the pusher drops what it has of ours; the file goes with us."""
        global _live
        if self.closed:
            return
        self.closed = True
        os.close(self.fd)
        if self._pid == os.getpid():  # a forked child counts its own rings from zero
            with _live_lock:
                _live -= 1

    def __del__(self) -> None:
        if not self.closed:
            self.close()


class Source(Protocol):
    """Where a loan's bytes are read while its buffer is being filled (``_filling``)."""

    address: int
    lock: threading.Lock


_Push = tuple[_Mapping, int, memoryview, Ring, "Source | None"]
"""A loan to push: the ring's mapping, the loan's number, the buffer, the ring, and where
its bytes are if elsewhere."""


class _Pusher:
    """The thread that pushes every ring's loans, in order (one per process)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[_Push] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="monarch-ring", daemon=True)
        self.thread.start()

    def put(self, item: _Push) -> None:
        self.queue.put(item)

    def _run(self) -> None:
        unpin_this_thread()  # started where the loop may be pinned (``_placement``)
        get = self.queue.get
        while True:
            mapping, loan, view, ring, source = get()
            try:
                if not ring.closed:
                    _push(mapping, loan, view, ring, source)
            except Exception:  # a bug here must not stop every later push
                log.exception("pushing a loan failed")
            del mapping, view, ring, source


def _push(
    mapping: _Mapping, loan: int, view: memoryview, ring: Ring, source: Source | None
) -> None:
    """Copy ``view`` (or what ``source`` says holds its bytes) into ``mapping``'s slots,
    one piece after the other, while the borrower wants it (``at`` below ``2 * loan + 1``:
    not done with it, not past it).

    Each side wakes the other only when it says it sleeps (``*_waiter``); a wake-up
    missed in the moment between saying so and sleeping costs one short sleep."""
    address, size = address_of(view), view.nbytes
    head, tail, at, waiter = mapping.head, mapping.tail, mapping.at, mapping.tail_waiter
    reader_waits = mapping.head_waiter
    slots, memmove, clock = mapping.slots, ctypes.memmove, time.monotonic
    wanted = 2 * loan + 1
    for piece, start in enumerate(range(0, size, SLOT)):
        filled = head.value
        if (filled - tail.value) & 0xFFFFFFFF >= SLOTS:  # full: wait for the borrower
            deadline = clock() + PUSH_PATIENCE
            while True:
                if at.value >= wanted or ring.closed:
                    return
                waiter.value = 1
                emptied = tail.value
                if (filled - emptied) & 0xFFFFFFFF < SLOTS:
                    waiter.value = 0
                    break
                left = deadline - clock()
                if left <= 0:
                    waiter.value = 0
                    return  # the borrower is not taking them: it will read the loan itself
                _wait(mapping.tail_at, emptied, min(left, 0.0005))
                waiter.value = 0
        elif at.value >= wanted or ring.closed:
            return
        slot = filled % SLOTS
        if source is None:
            memmove(slots + slot * SLOT, address + start, min(SLOT, size - start))
        else:
            with source.lock:  # the filling may not move meanwhile
                memmove(slots + slot * SLOT, source.address + start, min(SLOT, size - start))
        mapping.set_info(slot, loan, piece)
        head.value = (filled + 1) & 0xFFFFFFFF
        if reader_waits.value:
            _wake(mapping.head_at)


_pusher = PerProcess(_Pusher)


def _forget_rings() -> None:
    global _live
    _live = 0  # a forked child counts its own rings


os.register_at_fork(after_in_child=_forget_rings)


class RingReader:
    """The borrowing side of a peer's ring: the one thread that reads a connection's
    frames takes its slots."""

    def __init__(self, mapping: _Mapping) -> None:
        self._mapping = mapping
        self._last = 0
        """The last loan started: a later frame's loan numbered below it is read directly."""

    @classmethod
    def open(cls, pid: int, fd: int, ring_id: int) -> RingReader | None:
        """The ring ``pid`` holds open as ``fd``, if it may be opened and is that ring."""
        if _syscall is None:
            return None
        try:
            own = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            log.debug("cannot open the ring of process %d: %s", pid, exc)
            return None
        try:
            if os.fstat(own).st_size != SIZE:
                return None
            mapping = _Mapping(own)
        except (OSError, ValueError) as exc:
            log.debug("cannot map the ring of process %d: %s", pid, exc)
            return None
        finally:
            os.close(own)
        if mapping.id.value != ring_id:
            return None
        return cls(mapping)

    def take(self, loan: int, into: int, size: int) -> int:
        """Copy loan ``loan`` into ``into`` from the slots, piece after piece, while they
        come; returns how many bytes were copied (from the start). The rest is the
        caller's to read: the lender stops pushing this loan when this returns."""
        mapping = self._mapping
        if loan <= self._last:
            return 0  # its frame came after a later loan's: the lender has moved on
        self._last = loan
        at, head, tail = mapping.at, mapping.head, mapping.tail
        pusher_waits, tail_at = mapping.tail_waiter, mapping.tail_at
        slots, memmove, info, clock = mapping.slots, ctypes.memmove, mapping.info, time.monotonic
        cpu = time.thread_time
        at.value = 2 * loan
        done = 0
        try:
            while done < size:
                emptied = tail.value
                filled = head.value
                if filled == emptied:
                    if not self._await(filled, clock() + PATIENCE):
                        break
                    continue
                slot = emptied % SLOTS
                holds, which = info(slot)
                piece = done // SLOT
                slow = False
                if holds == loan and which == piece:
                    length = min(SLOT, size - done)
                    began, ran = clock(), cpu()
                    memmove(into + done, slots + slot * SLOT, length)
                    slow = (clock() - began) - (cpu() - ran) > SLOW  # not running: waiting
                    done += length
                elif holds > loan or (holds == loan and which > piece):
                    break  # the lender skipped ahead: the rest will not come
                tail.value = (emptied + 1) & 0xFFFFFFFF  # taken, or left over from before
                if pusher_waits.value:
                    _wake(tail_at)
                if slow:
                    break
        finally:
            mapping.taken.value = done  # before ``at``: see ``Ring.taken``
            at.value = 2 * loan + 1
            if pusher_waits.value:
                _wake(tail_at)
        global _taken
        _taken += done
        return done

    def _await(self, filled: int, deadline: float) -> bool:
        """Wait until the lender fills a slot past ``filled``, until ``deadline``:
        whether it did."""
        mapping, clock = self._mapping, time.monotonic
        head, waiter = mapping.head, mapping.head_waiter
        for _ in range(64):  # a slot is often moments away: look again before sleeping
            if head.value != filled:
                return True
        try:
            while True:
                waiter.value = 1
                if head.value != filled:
                    return True
                left = deadline - clock()
                if left <= 0:
                    return False
                _wait(mapping.head_at, filled, min(left, 0.0002))
        finally:
            waiter.value = 0
