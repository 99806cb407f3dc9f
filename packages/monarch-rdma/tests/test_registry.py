"""The registry's drop and the write gate: a drop waits for the writers of this host that
hold a buffer's gate, and says so at its deadline (never a hang) when one holds on."""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from monarch.core.lowlevel import WriteGate
from monarch.rdma import RDMATimeoutError
from monarch.rdma._region import region_of
from monarch.rdma._registry import Registry

FLOCK = struct.Struct("hhqqi")

pytestmark = pytest.mark.skipif(not hasattr(fcntl, "F_OFD_SETLK"), reason="Linux only")


@contextmanager
def holding(gate: WriteGate, buffer_id: int) -> Iterator[None]:
    """Hold a buffer's gate as a writer of this host does: a shared open-file-description
    lock on the byte at its id, through a file of our own."""
    fd = os.open(f"/proc/{os.getpid()}/fd/{gate.fd}", os.O_RDWR)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, FLOCK.pack(fcntl.F_RDLCK, 0, buffer_id, 1, 0))
        yield
    finally:
        os.close(fd)  # lets go of its lock


def test_a_drop_under_a_held_gate_ends_at_its_deadline_dropped_for_everyone_else() -> None:
    registry = Registry()
    memory = bytearray(64)
    buffer_id, cell = registry.register(region_of(memory))
    dropped: list[int] = []
    registry.on_drop.append(dropped.append)
    gate = registry.gate
    with holding(gate, buffer_id):
        with pytest.raises(RDMATimeoutError, match="still writes"):
            registry.drop(buffer_id, time.monotonic() + 0.1)
        assert registry.get(buffer_id) is None  # nobody else reaches it
        assert cell_of(cell) == (registry.token, 0)  # its cell says dropped (and is kept)
        assert dropped == [buffer_id]  # the planes let go of it all the same
    assert not registry.drop(buffer_id)  # once: nothing left to drop
    other, _ = registry.register(region_of(memory))
    assert registry.drop(other, time.monotonic() + 60)  # nobody holds it: at once


def cell_of(address: int) -> tuple[int, int]:
    words = (ctypes.c_uint64 * 2).from_address(address)
    return int(words[0]), int(words[1])
