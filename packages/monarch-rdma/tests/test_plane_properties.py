"""Property: whatever bulk-data plane moves a buffer (the core's memory plane, this wheel's
TCP plane), the bytes arrive equal and nothing else in the target changes: not the bytes
around the destination of a read, not the bytes around the buffer a write lands in.

One real owner proc per plane (module fixtures, as ``test_procs``); hypothesis draws the
sizes (up to past the size a copy is split among threads at), where in a larger array the
buffer and the destination sit, how much shorter than the buffer a write's source is, and
the bytes. Within a host a write goes straight into the owner's memory (under its write
gate): only the bytes written may change there."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured
from monarch.core import buffer_address
from monarch.core.lowlevel import MemoryPlane, bulk_planes
from monarch.rdma import RDMABuffer
from monarch.rdma._transfer import plane

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")

GUARD = 4096
"""Bytes kept around every buffer and destination, which must not change."""


def fill(size: int, seed: int) -> bytes:
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest()
    return (block * (size // len(block) + 1))[:size]


class Holder(Actor):
    """Owns one buffer: a slice of a larger array whose other bytes must never change."""

    def __init__(self) -> None:
        self.whole = bytearray()
        self.buffer: RDMABuffer | None = None

    @endpoint
    def make(self, before: int, size: int, after: int, seed: int) -> RDMABuffer:
        if self.buffer is not None:
            self.buffer.drop().get()
        self.whole = bytearray(fill(before + size + after, seed))
        self.buffer = RDMABuffer(memoryview(self.whole)[before : before + size])
        return self.buffer

    @endpoint
    def whole_digest(self) -> str:
        return hashlib.sha256(self.whole).hexdigest()


@pytest.fixture(scope="module", params=["memory", "tcp"])
def holder(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    way = str(request.param)
    with configured(read_peer_buffers=way == "memory"):
        procs = this_host().spawn_procs(per_host={"procs": 1})
        yield way, procs.spawn("holder", Holder)
        procs.stop().get(timeout=60)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.one_of(st.integers(1, 4096), st.integers(4097, 3 << 20), st.integers(8 << 20, 9 << 20)),
    short=st.one_of(st.just(0), st.integers(1, 1 << 20)),
    before=st.integers(0, GUARD),
    after=st.integers(0, GUARD),
    at=st.integers(0, GUARD),
    seed=st.integers(0, 1 << 30),
    writes=st.booleans(),
)
def test_any_plane_moves_exactly_the_buffer(
    holder: tuple[str, Any],
    size: int,
    before: int,
    after: int,
    at: int,
    seed: int,
    writes: bool,
    short: int,
) -> None:
    way, actor = holder
    buf = actor.make.call_one(before, size, after, seed).get(timeout=60)
    assert plane(buf._handle) == way
    owned = bytearray(fill(before + size + after, seed))
    # The destination (a read) or the source (a write) sits at ``at`` in a larger array.
    here = bytearray(fill(at + size + GUARD, seed + 1))
    if writes:  # all of a source up to ``short`` bytes shorter than the buffer
        written = max(1, size - short)
        data = bytes(here[at : at + written])
        buf.write_from(memoryview(here)[at : at + written]).get(timeout=60)
        owned[before : before + written] = data
        assert actor.whole_digest.call_one().get(timeout=60) == hashlib.sha256(owned).hexdigest()
        assert here == fill(at + size + GUARD, seed + 1)  # the source is left as it was
    else:
        expected = bytearray(here)
        expected[at : at + size] = owned[before : before + size]
        buf.read_into(memoryview(here)[at : at + size]).get(timeout=60)
        assert here == expected


def test_monarch_rdma_registers_its_planes_through_the_entry_point() -> None:
    from monarch.core.lowlevel import bulk_planes

    planes = bulk_planes()
    assert [p.name for p in planes.all()] == ["memory", "pull", "ibverbs", "tcp"]
    names = planes.group.names()
    assert names["ibverbs"] == names["tcp"] == "monarch-rdma"


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.one_of(st.integers(1, 4096), st.integers(4 << 20, 5 << 20)),
    before=st.integers(0, GUARD),
    after=st.integers(0, GUARD),
    seed=st.integers(0, 1 << 30),
)
def test_a_write_without_a_gate_is_pulled_by_the_owner_exactly(
    holder: tuple[str, Any], size: int, before: int, after: int, seed: int
) -> None:
    """An owner that lends no write gate (a system without open-file-description locks):
    the memory plane writes nothing itself; a write to an owner of this host comes to this
    wheel's ``pull`` plane next (the owner reads it out of us), one elsewhere to TCP; the
    same bytes land, nothing around them."""
    way, actor = holder
    buf = actor.make.call_one(before, size, after, seed).get(timeout=60)
    handle = dataclasses.replace(buf._handle, gate=-1)
    data = bytearray(fill(size, seed + 2))
    deadline = time.monotonic() + 60
    assert not MemoryPlane().write(handle, buffer_address(data), size, deadline)
    wrote = bulk_planes().write(handle, buffer_address(data), size, deadline)
    assert wrote.name == ("pull" if way == "memory" else "tcp")
    owned = bytearray(fill(before + size + after, seed))
    owned[before : before + size] = data
    assert actor.whole_digest.call_one().get(timeout=60) == hashlib.sha256(owned).hexdigest()
