"""This process's registered buffers, and the cells that say which are still live.

A reader on this host copies a buffer straight out of our memory, with no message to us,
so it must be able to tell by itself that the buffer is still registered: each buffer has
a *cell* in our memory holding (our token, its id), the id zeroed when it is dropped. The reader
checks the cell before and after copying; a copy that a drop overlapped is refused, never
returned as data. A writer cannot take its bytes back, so it also holds the buffer's
write gate (``monarch.core.lowlevel.WriteGate``) while it checks and writes, and a drop
clears the cell, then waits for the gate. Ids are never reused, so a cell reused for a
later buffer does not vouch for an earlier one. The identity cell holds (magic, our
token): a peer that reads it through our pid knows the pid is us, not a process that
reused the number. Both checks are the core memory plane's (``monarch.core.lowlevel.MemoryPlane``).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass

from monarch.core.lowlevel import IDENTITY_MAGIC, WriteGate

from ._errors import RDMATimeoutError
from ._region import Region


@dataclass(frozen=True, slots=True)
class Entry:
    region: Region
    cell: ctypes.Array[ctypes.c_uint64]


class Registry:
    """Buffers registered in this process, by id."""

    def __init__(self) -> None:
        self.token = secrets.randbits(63) | 1
        self.identity = (ctypes.c_uint64 * 2)(IDENTITY_MAGIC, self.token)
        self._entries: dict[int, Entry] = {}
        self._spare_cells: list[ctypes.Array[ctypes.c_uint64]] = []
        self._kept_cells: list[ctypes.Array[ctypes.c_uint64]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.on_drop: list[Callable[[int], object]] = []
        """Called with a buffer's id once it is dropped (the verbs plane deregisters it)."""
        self.atomics = threading.Lock()
        """Serialises this process's fetch_add/compare_and_swap (atomic among themselves)."""
        self._gate: WriteGate | None = None

    @property
    def gate(self) -> WriteGate:
        """Our buffers' write gates: peers of this host write them straight into our
        memory while they hold one, and a drop waits for them (made in this process)."""
        gate = self._gate
        if gate is None or gate.pid != os.getpid():
            with self._lock:
                gate = self._gate
                if gate is None or gate.pid != os.getpid():
                    gate = self._gate = WriteGate()
        return gate

    @property
    def identity_address(self) -> int:
        return ctypes.addressof(self.identity)

    def register(self, region: Region) -> tuple[int, int]:
        """Register ``region``; returns its id and the address of its cell."""
        with self._lock:
            buffer_id = next(self._ids)
            cell = self._spare_cells.pop() if self._spare_cells else (ctypes.c_uint64 * 2)()
            cell[0], cell[1] = self.token, buffer_id
            self._entries[buffer_id] = Entry(region, cell)
        return buffer_id, ctypes.addressof(cell)

    def get(self, buffer_id: int) -> Region | None:
        entry = self._entries.get(buffer_id)
        return None if entry is None else entry.region

    def drop(self, buffer_id: int, deadline: float | None = None) -> bool:
        """Unregister a buffer (its cell is cleared first, then the writers of this host
        that hold its gate are waited for); False if it was not registered.
        ``RDMATimeoutError`` if a writer still holds the gate at ``deadline`` (one stopped
        mid-write): the buffer is dropped for everyone else, but its memory may still be
        written until that writer goes on or dies."""
        with self._lock:
            entry = self._entries.pop(buffer_id, None)
            if entry is None:
                return False
            entry.cell[1] = 0  # the token stays: a reader tells a drop from a new process
        closed = self.gate.close(buffer_id, deadline)  # the writers that found it live
        with self._lock:  # a cell a writer may still read is kept, never reused
            (self._spare_cells if closed else self._kept_cells).append(entry.cell)
        for hook in self.on_drop:
            hook(buffer_id)
        if not closed:
            raise RDMATimeoutError(
                f"a writer of this host still writes buffer {buffer_id} (stopped?): it is "
                "dropped, but its memory may still be written until that writer ends"
            )
        return True

    def __len__(self) -> int:
        return len(self._entries)


registry = Registry()
"""This process's registry (procs are started by exec, never forked, so one per process)."""
