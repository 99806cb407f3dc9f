"""A tensor's copy at the call, made while the tensor travels.

A call's arguments are taken as they are at the call: a tensor's elements are copied
then (``_tensors``), since the caller may change the tensor in place as soon as the call
returns. Made before the message goes out, that copy and the transfer to the reader run
one after the other, twice the time ``bytes`` of the same size take (they need no copy).

So for a large tensor in a call to one process of this machine, the copy is deferred
(``deferred_fills``): the *snapshot* buffer is lent at once, unfilled (``Filling``); the
ring's pusher (``_ring``) pushes the tensor's own elements while the reader takes them;
and before the call returns, the caller fills the snapshot with what the reader did not
take from the ring (usually nothing), sets the *marker* (the 8 bytes after the
snapshot), which a reader wanting more waits for before reading the snapshot, and points
the pusher at the snapshot, so that nothing reads the tensor once the call has returned.
Anywhere else (another machine, a message handed to the loop or sent to this process, no
ring), the snapshot is filled before the message goes anywhere, as a plain copy would be.

A snapshot is lent unfilled only through a ring, so only where rings are (x86-64 Linux):
the marker is stored after the copy's stores, which that architecture keeps in order.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any, Final, Protocol

MARKER_SIZE: Final = 8
DEFER_MIN: Final = 4 * 1024 * 1024
"""Tensors from this size may defer their copy (the ring's ``RING_MIN``: smaller loans are
not pushed through it)."""
FILLED: Final = 0x6D6F6E6172636821
"""The marker's value once the snapshot is filled (0 before)."""


class Pushed(Protocol):
    """A ring a filling's loan was pushed through (``_ring.Ring``)."""

    def taken(self, loan: int) -> int: ...


class Filling:
    """A snapshot lent before it is filled, and where its elements are meanwhile."""

    __slots__ = ("address", "base", "loans", "lock", "size", "snapshot", "source", "view")

    def __init__(
        self, snapshot: bytearray, base: int, size: int, source: Any, address: int
    ) -> None:
        self.snapshot = snapshot
        self.base = base
        """Where the snapshot is (its marker ``size`` bytes further)."""
        self.size = size
        self.view = memoryview(snapshot)[:size]
        """What the pickle carries (its buffer): what the lender is handed."""
        self.source: Any = source
        """The tensor, alive until the snapshot is filled."""
        self.address = address
        """Where the pusher reads the elements (under ``lock``): the tensor's memory, then,
        once filled, the snapshot's."""
        self.lock = threading.Lock()
        self.loans: list[tuple[Pushed, int]] = []
        """The rings this snapshot's loans were pushed through, and their numbers."""

    def fill(self, start: int = 0) -> None:
        """Copy the elements from ``start`` on into the snapshot, set the marker, and
        leave the tensor alone from now on (once: later calls do nothing)."""
        if self.source is None:
            return
        base, source = self.base, self.address
        if start < self.size:
            ctypes.memmove(base + start, source + start, self.size - start)
        ctypes.c_uint64.from_address(base + self.size).value = FILLED
        with self.lock:
            self.address = base
        self.source = None

    def needed_from(self) -> int:
        """Where the snapshot must be filled from: what every reader took from its ring
        (waiting while they take), 0 where that is not known."""
        return min((ring.taken(loan) for ring, loan in self.loans), default=0)


class _Pending(threading.local):
    def __init__(self) -> None:
        self.deferring = False
        self.fills: dict[int, Filling] = {}
        """This thread's fillings not filled yet, by the id of their ``view``."""


_pending = _Pending()


def deferring() -> bool:
    """Whether a tensor pickled now may leave its copy for later (see the module)."""
    return _pending.deferring


class _Deferred:
    """``with deferred_fills:`` around a call's pickling and sending: its tensors' copies
    are made at the end, as late as they can be (see the module). One object for every
    thread (the state is the thread's): a broadcast pays a fraction of a microsecond."""

    __slots__ = ()

    def __enter__(self) -> None:
        _pending.deferring = True

    def __exit__(self, *exc: object) -> None:
        _pending.deferring = False
        if _pending.fills:
            settle()


deferred_fills: Final = _Deferred()


def new_filling(snapshot: bytearray, base: int, source: Any, address: int) -> Filling:
    """``snapshot``, at ``base`` (``MARKER_SIZE`` bytes longer than the elements), of the
    elements at ``address`` (``source``'s), to be filled by the end of the call; its marker
    cleared (fresh memory may hold an old one)."""
    size = len(snapshot) - MARKER_SIZE
    ctypes.c_uint64.from_address(base + size).value = 0
    filling = Filling(snapshot, base, size, source, address)
    _pending.fills[id(filling.view)] = filling
    return filling


def filling_of(view: memoryview) -> Filling | None:
    """The unfilled snapshot ``view`` (a part of a frame) is, if it is one of this thread's."""
    fills = _pending.fills
    return fills.get(id(view.obj)) if fills else None


def any_pending() -> bool:
    return bool(_pending.fills)


def fill_parts(parts: Sequence[Any]) -> None:
    """Fill at once the unfilled snapshots among ``parts`` (a message that goes anywhere
    but through a ring to one reader)."""
    fills = _pending.fills
    if not fills:
        return
    for part in parts:
        if isinstance(part, memoryview):
            filling = fills.pop(id(part.obj), None)
            if filling is not None:
                filling.fill()


def fill_now(filling: Filling) -> None:
    """Fill ``filling`` at once (it has no ring to travel through while it fills)."""
    _pending.fills.pop(id(filling.view), None)
    filling.fill()


def settle() -> None:
    """Fill this thread's snapshots: each from where its readers stopped taking."""
    fills = _pending.fills
    while fills:
        _, filling = fills.popitem()
        filling.fill(filling.needed_from())
