"""Any interleaving of reads, writes, atomics and drops (by a holder or by the owner) on
buffers of another process ends every future in a value or ``RDMABufferDropped``; a read
that succeeds brings, byte by byte, what was there or what some write put there."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import Actor, endpoint, this_host
from monarch.core import Future
from monarch.rdma import RDMAAction, RDMABuffer, RDMABufferDropped

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")

SIZES = (64, 4096, 2 * 1024 * 1024 + 3)  # inline copies, and one handed to a thread


class Keeper(Actor):
    def __init__(self) -> None:
        self.buffers: dict[str, RDMABuffer] = {}
        self.memory: dict[str, bytearray] = {}

    @endpoint
    def make(self, name: str, size: int) -> RDMABuffer:
        self.memory[name] = bytearray(size)  # zeros
        self.buffers[name] = RDMABuffer(self.memory[name])
        return self.buffers[name]

    @endpoint
    def drop(self, name: str) -> None:
        """Drop and free the memory (a second time: nothing to do)."""
        buf = self.buffers.pop(name, None)
        if buf is not None:
            buf.drop().get()
            del self.memory[name]


@pytest.fixture(scope="module")
def keeper() -> Iterator[Any]:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    yield procs.spawn("keeper", Keeper)
    procs.stop().get(timeout=60)


names = itertools.count()
step = st.tuples(st.sampled_from(["read", "write", "add", "drop", "owner_drop"]), st.integers(0, 2))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(step, max_size=8))
def test_every_future_ends_in_a_value_or_a_drop(keeper: Any, steps: list[tuple[str, int]]) -> None:
    tag = next(names)
    bufs = [
        keeper.make.call_one(f"b{tag}-{i}", size).get(timeout=60) for i, size in enumerate(SIZES)
    ]
    written: list[set[int]] = [{0} for _ in SIZES]
    pending: list[tuple[str, int, bytearray | None, Future[Any]]] = []
    for n, (kind, i) in enumerate(steps):
        buf = bufs[i]
        if kind == "read":
            out = bytearray(buf.size())
            pending.append((kind, i, out, buf.read_into(out)))
        elif kind == "write":
            value = n + 1
            written[i].add(value)
            pending.append((kind, i, None, buf.write_from(bytes([value]) * buf.size())))
        elif kind == "add":
            old = bytearray(8)
            pending.append((kind, i, None, RDMAAction().fetch_add(buf, old, 0).submit()))
        elif kind == "drop":
            pending.append((kind, i, None, buf.drop()))
        else:
            pending.append((kind, i, None, keeper.drop.call_one(f"b{tag}-{i}")))
    for kind, i, into, future in pending:
        try:
            future.get(timeout=60)
        except RDMABufferDropped:
            assert kind in ("read", "write", "add")
            continue
        if into is not None:
            # fetch_add of 0 leaves bytes alone; writes may interleave with the read
            assert set(into) <= written[i], (set(into), written[i])
    for buf in bufs:
        buf.drop().get(timeout=60)
