"""Run in the soft-RoCE VM: monarch-rdma's API between the client and a proc over real verbs.

Peers of one host would use shared memory; ``read_peer_buffers=False`` takes that plane
away, so every transfer between processes goes by RDMA READ/WRITE. Prints RDMA-VERBS-OK.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading

import monarch.actor
from monarch.actor import Actor, endpoint, this_host
from monarch.config import configure
from monarch.rdma import (
    RDMABuffer,
    RDMABufferDropped,
    RDMATransferError,
    get_rdma_backend,
    is_ibverbs_available,
)
from monarch.rdma._transfer import plane

MIB = 1024 * 1024


def pattern(size: int, seed: int) -> bytes:
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * 2048
    return (block * (size // len(block) + 1))[:size]


class Owner(Actor):
    def __init__(self) -> None:
        self.memory: dict[int, bytearray] = {}

    @endpoint
    def make(self, size: int, seed: int) -> RDMABuffer:
        self.memory[seed] = bytearray(pattern(size, seed))
        return RDMABuffer(self.memory[seed])

    @endpoint
    def digest(self, seed: int) -> str:
        return hashlib.sha256(self.memory[seed]).hexdigest()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def main() -> int:
    # Under emulation a process takes a minute or more to start: generous deadlines.
    configure(read_peer_buffers=False, host_spawn_ready_timeout="600s")
    print("ibverbs available:", is_ibverbs_available(), "backend:", get_rdma_backend(), flush=True)
    assert get_rdma_backend() == "ibverbs"
    procs = this_host().spawn_procs(per_host={"procs": 1})
    owner = procs.spawn("owner", Owner)
    for seed, size in enumerate([1, MIB + 3, 9 * MIB + 1]):
        buf = owner.make.call_one(size, seed).get(timeout=600)
        assert plane(buf._handle) == "ibverbs"
        out = bytearray(size)
        buf.read_into(out, timeout=300).get(timeout=600)
        assert out == pattern(size, seed), "read brought other bytes"
        buf.write_from(pattern(size, seed + 100), timeout=300).get(timeout=600)
        expected = hashlib.sha256(pattern(size, seed + 100)).hexdigest()
        assert owner.digest.call_one(seed).get(timeout=600) == expected, "write not seen"
        print(f"ok: {size} bytes read and written over ibverbs", flush=True)
        buf.drop().get(timeout=600)
        try:
            buf.read_into(out, timeout=300).get(timeout=600)
        except RDMABufferDropped:
            print("ok: a dropped buffer refused", flush=True)
        else:
            raise AssertionError("a dropped buffer was read")
    # an owner that dies: the queue pair's retries run out, the read ends with an error
    dead = threading.Event()
    monarch.actor.unhandled_fault_hook = lambda failure: dead.set()
    buf = owner.make.call_one(4096, 50).get(timeout=600)
    buf.read_into(bytearray(4096), timeout=300).get(timeout=600)
    pid = owner.pid.call_one().get(timeout=600)
    print(f"killing the owner (pid {pid})", flush=True)
    os.kill(pid, signal.SIGKILL)
    assert dead.wait(300), "the owner's death was not noticed"
    print("the owner's death was noticed", flush=True)
    try:
        buf.read_into(bytearray(4096), timeout=120).get(timeout=300)
    except RDMATransferError as error:
        print(f"ok: a dead owner's buffer ends in {type(error).__name__}: {error}", flush=True)
    else:
        raise AssertionError("a dead owner's buffer was read")
    print("RDMA-VERBS-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
