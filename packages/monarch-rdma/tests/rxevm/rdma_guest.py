"""Run in the soft-RoCE VM: monarch-rdma's API between real procs over real verbs (rxe0).

Peers of one host would use shared memory; ``read_peer_buffers=False`` takes that plane
away, so every transfer between processes goes by RDMA READ/WRITE. Prints RDMA-VERBS-OK.
"""

from __future__ import annotations

import hashlib
import sys

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configure
from monarch.rdma import RDMABuffer, RDMABufferDropped, get_rdma_backend, is_ibverbs_available
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


class Peer(Actor):
    @endpoint
    def read(self, buf: RDMABuffer) -> tuple[str, str]:
        out = bytearray(buf.size())
        buf.read_into(out).get(timeout=120)
        return plane(buf._handle), hashlib.sha256(out).hexdigest()

    @endpoint
    def write(self, buf: RDMABuffer, size: int, seed: int) -> str:
        buf.write_from(pattern(size, seed)).get(timeout=120)
        return plane(buf._handle)


def main() -> int:
    # TCG emulation is slow: a proc takes tens of seconds to start
    configure(
        read_peer_buffers=False, host_spawn_ready_timeout="400s", message_delivery_timeout="400s"
    )
    print("ibverbs available:", is_ibverbs_available(), "backend:", get_rdma_backend(), flush=True)
    assert get_rdma_backend() == "ibverbs"
    procs = this_host().spawn_procs(per_host={"procs": 2})
    owner = procs.slice(procs=0).spawn("owner", Owner)
    peer = procs.slice(procs=1).spawn("peer", Peer)
    for seed, size in enumerate([1, MIB + 3, 9 * MIB + 1]):
        buf = owner.make.call_one(size, seed).get(timeout=120)
        way, digest = peer.read.call_one(buf).get(timeout=120)
        assert (way, digest) == ("ibverbs", hashlib.sha256(pattern(size, seed)).hexdigest()), way
        assert peer.write.call_one(buf, size, seed + 100).get(timeout=120) == "ibverbs"
        expected = hashlib.sha256(pattern(size, seed + 100)).hexdigest()
        assert owner.digest.call_one(seed).get(timeout=120) == expected
        out = bytearray(size)  # the client too, by verbs
        assert plane(buf._handle) == "ibverbs"
        buf.read_into(out).get(timeout=120)
        assert out == pattern(size, seed + 100)
        print(f"ok: {size} bytes read and written over ibverbs", flush=True)
        buf.drop().get(timeout=120)
        try:
            buf.read_into(out).get(timeout=120)
        except RDMABufferDropped:
            print("ok: a dropped buffer refused", flush=True)
        else:
            raise AssertionError("a dropped buffer was read")
    procs.stop().get(timeout=120)
    print("RDMA-VERBS-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
