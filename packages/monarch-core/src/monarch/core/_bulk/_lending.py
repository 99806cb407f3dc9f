"""Large buffers lent between processes of one machine, not written to the socket.

Through a socket, a large buffer is copied into the kernel by its sender and out again
by its receiver, which then copies it once more into the ``bytes`` it unpickles. Between
processes of one machine that may read each other's memory (``process_vm_readv``: same
user, no ptrace restriction in the way), the sender instead *lends* the buffer: the
message carries a small descriptor (its pid, address and size), the receiver reads the
bytes straight into the object it will hand to pickle (a fresh ``bytes`` for a ``bytes``
payload, so nothing is copied again), then gives the loan back. The lender keeps the
buffer alive until then, or until the borrower is declared dead. Where it can, the
lender also pushes a large loan through a ring of shared memory while the borrower takes
it out (see ``_ring``): faster than reading it, and the read covers whatever the ring
does not bring in time. The read is the same-host memory plane's (``_memory_plane``),
the one that also moves ``RDMABuffer`` regions between processes of one machine.

The ``Lender`` is the bulk wing's one book of loans: the same keys, given back the same
way, hold a transport's frame parts lent through a plane of its connection (monarch-rdma's
ibverbs transport), where the plane holds each part until its key comes back.

Whether a peer can read us is tested once per connection (see ``Runtime``): our hello
carries our pid and the address of our incarnation token; the peer reads it and says
so in its answer. Only then do we lend to it.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from monarch.core._errors import PullError
from monarch.core._payload import _memory as memory
from monarch.core._payload._filling import FILLED, MARKER_SIZE, fill_now, filling_of
from monarch.transport import Buffer

from ._memory_plane import available as available
from ._memory_plane import is_peer, read_range
from ._plane import Plane
from ._ring import RING_MIN, Ring, RingReader

LEND_MIN: Final = 1024 * 1024
"""Buffers from this size are lent rather than written to the socket."""
MAGIC: Final = b"\x00monarch-loan\x00\x00\x00"
_DESCRIPTOR: Final = struct.Struct("<16sQQQQQqQQ")
DESCRIPTOR_SIZE: Final = _DESCRIPTOR.size
"""A descriptor part: MAGIC, key, pid, address, size, kind, and where the lender pushes
it (its ring's fd, or -1; the ring's id; the loan's number there). No other part has
this size and prefix (pickles start with the PROTO opcode; out-of-band buffers are
large)."""
_BYTES: Final = 1
_BUFFER: Final = 2
_FILLING: Final = 3
"""A snapshot lent before it is filled (see ``_filling``): what its ring does not bring is
read once its marker says it is filled."""
FILL_TIMEOUT: Final = 120.0
"""Seconds a borrower waits for a lender's snapshot to be filled (a copy in progress)."""


def pull(
    pid: int,
    address: int,
    size: int,
    kind: int = _BUFFER,
    ring: RingReader | None = None,
    loan: int = 0,
) -> bytes | bytearray:
    """Read ``size`` bytes at ``address`` in process ``pid`` into a new object: a
    ``bytes`` (which nothing else has seen yet, so filling it is safe) or a bytearray.

    What the lender pushes through its ``ring`` (loan number ``loan``) is taken from
    there (see ``_ring``); the rest is read here, by the memory plane (``read_range``)."""
    into = memory.fresh_bytes(size) if kind == _BYTES else memory.fresh_bytearray(size)
    base = memory.address_of(into)
    done = ring.take(loan, base, size) if ring is not None else 0
    if done < size:
        if kind == _FILLING:
            _await_filled(pid, address + size)
        read_range(pid, base + done, address + done, size - done)
    return into


def _await_filled(pid: int, marker: int) -> None:
    """Wait until the lender has filled the snapshot whose marker is at ``marker``."""
    word = ctypes.c_uint64(0)
    deadline = time.monotonic() + FILL_TIMEOUT
    pause = 0.00005
    while True:
        read_range(pid, ctypes.addressof(word), marker, MARKER_SIZE)
        if word.value == FILLED:
            return
        if time.monotonic() > deadline:
            raise PullError(0, f"process {pid} did not fill a lent tensor in {FILL_TIMEOUT:.0f} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.001)


def can_read(pid: int, address: int, expected: bytes) -> bool:
    """Whether process ``pid`` holds ``expected`` at ``address`` and we may read it (the
    memory plane's one identity check, ``is_peer``)."""
    return is_peer(pid, address, expected)


def is_descriptor(part: Buffer) -> bool:
    return len(part) == DESCRIPTOR_SIZE and bytes(part[:16]) == MAGIC


class Lender:
    """This process's buffers on loan, by key: kept alive until given back (or their
    borrower is declared dead), and, for a loan lent through a plane, held by that plane
    until then.

    The one book of loans of the bulk wing: the runtime lends the large parts of actor
    messages to readers of this host (``lend_parts``: the memory plane, which holds
    nothing), a transport the parts of its frames through a plane of its own connection
    (``lend``: monarch-rdma's ibverbs transport registers each with its queue pair). The
    borrower reads the loan through the plane, then gives its key back."""

    def __init__(self) -> None:
        self._loans: dict[int, tuple[memoryview, str, Plane | None]] = {}
        self._lent: dict[str, int] = {}
        """Bytes on loan, by borrower: what a sender to it holds (see ``_runtime._flow``)."""
        self._keys = itertools.count(1)
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self._loans)

    def lent_to(self, borrower: str) -> int:
        """Bytes ``borrower`` has not given back yet."""
        return self._lent.get(borrower, 0)

    def lend(
        self, view: memoryview, borrower: str, plane: Plane | None = None
    ) -> tuple[int, tuple[Any, ...] | None] | None:
        """Lend ``view`` to ``borrower`` (through ``plane``, if one): its key, and what
        the plane said the borrower needs to reach it; None if the plane cannot lend it
        (the caller sends the bytes another way)."""
        key = next(self._keys)
        reach = None
        if plane is not None:
            reach = plane.lend(key, memory.address_of(view), view.nbytes)
            if reach is None:
                return None
        self._keep(key, view, borrower, plane)
        return key, reach

    def _keep(self, key: int, view: memoryview, borrower: str, plane: Plane | None) -> None:
        with self._lock:
            self._loans[key] = (view, borrower, plane)
            self._lent[borrower] = self._lent.get(borrower, 0) + view.nbytes

    def lend_parts(
        self,
        parts: Sequence[Buffer],
        borrower: str,
        ring: Callable[[], Ring | None] | None = None,
    ) -> Sequence[Buffer]:
        """``parts`` with its large buffers (after the envelope, body and first pickle)
        replaced by descriptors lent to ``borrower``; ``parts`` itself if none is large.
        One of RING_MIN or more is also pushed through ``ring()``, our ring to it, if
        there is one (asked for only then: a peer lent only smaller ones needs none)."""
        out: list[Buffer] | None = None
        for i in range(3, len(parts)):
            part = parts[i]
            view = part if isinstance(part, memoryview) else memoryview(part)
            if view.nbytes < LEND_MIN or not view.c_contiguous:
                continue
            if out is None:
                out = list(parts)
            out[i] = self._lend(view, borrower, ring)
        return parts if out is None else out

    def _lend(
        self, view: memoryview, borrower: str, ring: Callable[[], Ring | None] | None
    ) -> bytes:
        kind = _BYTES if type(view.obj) is bytes and view.nbytes == len(view.obj) else _BUFFER
        filling = filling_of(view)
        key = next(self._keys)
        self._keep(key, view, borrower, None)
        address, size = memory.address_of(view), view.nbytes
        fd, ring_id, loan = -1, 0, 0
        pushed = ring() if ring is not None and size >= RING_MIN else None
        if pushed is not None and not pushed.closed:
            fd, ring_id, loan = pushed.fd, pushed.id, pushed.push(view, filling)
            if filling is not None:
                kind = _FILLING
                filling.loans.append((pushed, loan))
        elif filling is not None:
            fill_now(filling)  # no ring to push it through while it fills: filled first
        return _DESCRIPTOR.pack(MAGIC, key, self._pid, address, size, kind, fd, ring_id, loan)

    def give_back(self, keys: Sequence[int]) -> None:
        """The borrower has read these loans: their planes let go of them, then we do."""
        held: list[tuple[int, Plane]] = []
        with self._lock:
            for key in keys:
                loan = self._loans.pop(key, None)
                if loan is not None:
                    self._lent[loan[1]] -= loan[0].nbytes
                    if loan[2] is not None:
                        held.append((key, loan[2]))
        for key, plane in held:
            plane.release(key)

    def forget(self, borrower: str) -> None:
        """The borrower is dead (or its connection gone): what it had not given back is
        ours again."""
        with self._lock:
            keys = [k for k, (_, b, _) in self._loans.items() if b == borrower]
            loans = [(key, self._loans.pop(key)) for key in keys]
            self._lent.pop(borrower, None)
        for key, (_, _, plane) in loans:
            if plane is not None:
                plane.release(key)


RingKey = tuple[int, int, int]
"""A lender's ring as its descriptors name it: pid, fd, id."""


def borrow(
    parts: Sequence[Buffer], rings: dict[RingKey, RingReader | None] | None = None
) -> tuple[list[Buffer], list[int]]:
    """``parts`` with every descriptor replaced by the buffer it lends (read now), and
    the keys to give back to the lender. ``rings``: the lenders' rings this connection
    has opened so far (opened here when first named; None if one cannot be)."""
    out = list(parts)
    keys: list[int] = []
    for i in range(2, len(out)):
        part = out[i]
        if not is_descriptor(part):
            continue
        _, key, pid, address, size, kind, fd, ring_id, loan = _DESCRIPTOR.unpack(bytes(part))
        ring = None
        if fd >= 0 and rings is not None:
            name = (pid, fd, ring_id)
            if name in rings:
                ring = rings[name]
            else:
                ring = rings[name] = RingReader.open(pid, fd, ring_id)
        out[i] = pull(pid, address, size, kind, ring, loan)
        keys.append(key)
    return out, keys
