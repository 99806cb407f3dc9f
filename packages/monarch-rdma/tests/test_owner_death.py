"""A buffer whose owner died: every operation ends with RDMAOwnerDied, never a hang and
never stale bytes reported as data; a transfer cut mid-way by the death ends in an error."""

from __future__ import annotations

import os
import signal

import pytest

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured
from monarch.core.testing import Failures
from monarch.rdma import RDMAAction, RDMABuffer, RDMAOwnerDied, RDMATransferError

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")

MIB = 1024 * 1024


class Doomed(Actor):
    def __init__(self) -> None:
        self.data = bytearray(b"z" * (32 * MIB))
        self.buf = RDMABuffer(self.data)

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.mark.parametrize("way", ["memory", "tcp"])
def test_a_dead_owner_fails_every_operation(way: str, unhandled_failures: Failures) -> None:
    with configured(read_peer_buffers=way == "memory"):
        procs = this_host().spawn_procs(per_host={"procs": 1})
        doomed = procs.spawn(f"doomed_{way}", Doomed)
        buf = doomed.handle.call_one().get(timeout=60)
        os.kill(doomed.pid.call_one().get(timeout=60), signal.SIGKILL)
        unhandled_failures.wait_for(f"doomed_{way}")  # the client has seen the death
        with pytest.raises(RDMAOwnerDied):
            buf.read_into(bytearray(buf.size())).get(timeout=60)
        with pytest.raises(RDMAOwnerDied):
            buf.write_from(b"x" * 10).get(timeout=60)
        with pytest.raises(RDMAOwnerDied):
            RDMAAction().fetch_add(buf, bytearray(8), 1).submit().get(timeout=60)
        buf.drop().get(timeout=60)  # nothing left to release: done


@pytest.mark.parametrize("way", ["memory", "tcp"])
def test_a_death_during_transfers_ends_each_in_a_value_or_an_error(
    way: str, unhandled_failures: Failures
) -> None:
    """Reads racing the owner's death: each either brought the whole buffer or failed."""
    with configured(read_peer_buffers=way == "memory", rdma_max_chunk_size_mb=1):
        procs = this_host().spawn_procs(per_host={"procs": 1})
        doomed = procs.spawn(f"cut_{way}", Doomed)
        buf = doomed.handle.call_one().get(timeout=60)
        pid = doomed.pid.call_one().get(timeout=60)
        outs = [bytearray(buf.size()) for _ in range(4)]
        futures = [buf.read_into(out, timeout=60) for out in outs]
        os.kill(pid, signal.SIGKILL)
        for out, future in zip(outs, futures, strict=True):
            try:
                future.get(timeout=90)
            except RDMATransferError:
                continue
            assert out == b"z" * len(out)
        unhandled_failures.wait_for(f"cut_{way}")
