"""A job over the ``ibverbs`` transport: ordinary actor calls with large ``bytes`` and torch
tensors between the client and two procs, and from one proc to the other.

Run as a script (a fresh client: the transport is chosen before Monarch starts):
``python rdma_transport_job.py rdma`` expects the large parts to have moved by RDMA READ
(the soft-RoCE VM, ``test_verbs_vm``), ``tcp`` expects the fallback (no device:
``test_transport``). Prints ``TRANSPORT-JOB-OK`` at the end.
"""

from __future__ import annotations

import hashlib
import sys

import torch

from monarch.actor import Actor, enable_transport, endpoint, this_host
from monarch.config import configure
from monarch.core import running_runtime
from monarch.rdma._transport import transport_stats

MIB = 1024 * 1024


def pattern(size: int, seed: int) -> bytes:
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest() * 2048
    return (block * (size // len(block) + 1))[:size]


class Peer(Actor):
    @endpoint
    def digest(self, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    @endpoint
    def double(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor * 2

    @endpoint
    def relay(self, other: Peer, size: int, seed: int) -> str:
        """Send ``other`` (an actor of another proc) large bytes; the digest it saw."""
        digest: str = other.digest.call_one(pattern(size, seed)).get(timeout=600)
        return digest

    @endpoint
    def stats(self) -> dict[str, int]:
        return transport_stats()


def main(expect: str) -> int:
    enable_transport("ibverbs")
    configure(host_spawn_ready_timeout="600s")
    procs = this_host().spawn_procs(per_host={"procs": 2})
    peers = procs.spawn("peer", Peer)
    first, second = peers.slice(procs=0), peers.slice(procs=1)
    address = running_runtime().address  # type: ignore[union-attr]
    assert address.startswith("ibverbs://"), address
    for size, seed in ((1, 0), (4 * MIB + 3, 1), (9 * MIB, 2)):
        data = pattern(size, seed)
        seen = first.digest.call_one(data).get(timeout=600)
        assert seen == hashlib.sha256(data).hexdigest(), f"{size} bytes came changed"
        relayed = first.relay.call_one(second, size, seed + 10).get(timeout=600)
        assert relayed == hashlib.sha256(pattern(size, seed + 10)).hexdigest(), "relay changed"
    tensor = torch.arange(3 * MIB, dtype=torch.float32)  # 12 MiB
    doubled = second.double.call_one(tensor).get(timeout=600)
    assert torch.equal(doubled, tensor * 2), "the tensor came back changed"
    print("ok: large bytes and tensors delivered equal over the ibverbs transport", flush=True)
    ours = transport_stats()
    theirs = [p.stats.call_one().get(timeout=600) for p in (first, second)]
    print(f"client {ours}; procs {theirs}", flush=True)
    read = ours["read_parts"] + sum(s["read_parts"] for s in theirs)
    offered = ours["offered_parts"] + sum(s["offered_parts"] for s in theirs)
    if expect == "rdma":
        # client -> first: 2 bytes parts; first -> second: 2; client -> second: the tensor;
        # second -> client: the doubled tensor
        assert ours["offered_parts"] >= 3 and ours["read_parts"] >= 1, ours
        assert theirs[0]["read_parts"] >= 2 and theirs[0]["offered_parts"] >= 2, theirs
        assert theirs[1]["read_parts"] >= 3 and theirs[1]["offered_parts"] >= 1, theirs
        assert read == offered, (read, offered)
        print(f"ok: {read} parts moved by RDMA READ over ibverbs", flush=True)
    else:
        assert read == offered == 0, (read, offered)
        print("ok: no device, every part went by TCP", flush=True)
    print("TRANSPORT-JOB-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
