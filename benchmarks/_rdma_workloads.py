"""The RDMA workloads of ``rdma_bench.py``, written against upstream's API only.

Run by ``rdma_bench.py`` in a process of its own, once with our monarch (this repository's
interpreter) and once with upstream torchmonarch 0.7.0 (``benchmarks/.venvs/upstream``), so
both measure the very same code. Buffers are memoryviews over bytearrays (upstream's
``RDMABuffer`` takes a memoryview or a tensor). Times are taken inside the reading actor,
around ``.get()`` of each operation: the transfer, not the call that asks for it.

    python _rdma_workloads.py --json OUT [--reps N] [--quick] [--tcp]

``--tcp`` (ours only) makes peers of one host use the TCP plane (``read_peer_buffers``);
``--untagged`` with it leaves the bytes untagged (``rdma_tcp_integrity=False``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import Any

try:  # as a user's client would: torch first (its import changes what monarch finds)
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - the workloads need no torch
    pass

from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMAAction, RDMABuffer

MIB = 1024 * 1024
warnings.simplefilter("ignore")


def filled(size: int) -> memoryview:
    """Memory with every page touched (an untouched page reads as the zero page)."""
    return memoryview(bytearray(b"\x5a") * size)


class Owner(Actor):
    def __init__(self) -> None:
        warnings.simplefilter("ignore")
        self.keep: list[tuple[memoryview, RDMABuffer]] = []

    @endpoint
    def make(self, size: int) -> RDMABuffer:
        memory = filled(size)
        buf = RDMABuffer(memory)
        self.keep.append((memory, buf))
        return buf


class Reader(Actor):
    def __init__(self) -> None:
        warnings.simplefilter("ignore")

    @endpoint
    def first_buffer(self) -> float:
        """Seconds to register the first buffer of this process (and drop it)."""
        t0 = time.perf_counter()
        buf = RDMABuffer(filled(4096))
        took = time.perf_counter() - t0
        buf.drop().get()
        return took

    @endpoint
    def register(self, size: int, reps: int) -> dict[str, list[float]]:
        memory = memoryview(bytearray(size))
        out: dict[str, list[float]] = {"register": [], "drop": []}
        for _ in range(reps):
            t0 = time.perf_counter()
            buf = RDMABuffer(memory)
            t1 = time.perf_counter()
            buf.drop().get()
            t2 = time.perf_counter()
            out["register"].append(t1 - t0)
            out["drop"].append(t2 - t1)
        return out

    @endpoint
    def reads(self, buf: RDMABuffer, reps: int) -> list[float]:
        dst = filled(buf.size())
        buf.read_into(dst).get()  # warm-up: connections, first-use costs
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            buf.read_into(dst).get()
            times.append(time.perf_counter() - t0)
        if dst[0] != 0x5A or dst[-1] != 0x5A:
            raise AssertionError("read brought wrong bytes")
        return times

    @endpoint
    def writes(self, buf: RDMABuffer, reps: int) -> list[float]:
        src = filled(buf.size())
        buf.write_from(src).get()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            buf.write_from(src).get()
            times.append(time.perf_counter() - t0)
        return times

    @endpoint
    def batch(self, bufs: list[RDMABuffer], reps: int) -> dict[str, list[float]]:
        dsts = [filled(b.size()) for b in bufs]
        action = RDMAAction()
        for dst, buf in zip(dsts, bufs, strict=True):
            action.read_remote(dst, buf)
        action.submit().get()
        for dst, buf in zip(dsts, bufs, strict=True):
            buf.read_into(dst).get()
        out: dict[str, list[float]] = {"action": [], "sequential": []}
        for _ in range(reps):
            t0 = time.perf_counter()
            action.submit().get()
            t1 = time.perf_counter()
            for dst, buf in zip(dsts, bufs, strict=True):
                buf.read_into(dst).get()
            t2 = time.perf_counter()
            out["action"].append(t1 - t0)
            out["sequential"].append(t2 - t1)
        return out


def progress(text: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", flush=True)


def run(reps: int, sizes: list[int], batch: int, register_mib: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    errors: dict[str, str] = {}
    owners = this_host().spawn_procs(per_host={"procs": 1})
    readers = this_host().spawn_procs(per_host={"procs": 1})
    owner = owners.spawn("owner", Owner)
    reader = readers.spawn("reader", Reader)

    def attempt(name: str, fn: Any) -> None:
        progress(name)
        try:
            figures[name] = fn()
        except Exception as error:  # noqa: BLE001 - reported, the others still run
            errors[name] = f"{type(error).__name__}: {error}"[:500]

    attempt("first_buffer_s", lambda: reader.first_buffer.call_one().get())
    attempt(
        f"register_{register_mib}MiB_s",
        lambda: reader.register.call_one(register_mib * MIB, reps).get(),
    )
    for mib in sizes:
        buf = owner.make.call_one(mib * MIB).get()
        attempt(f"read_{mib}MiB_s", lambda buf=buf: reader.reads.call_one(buf, reps).get())
        attempt(f"write_{mib}MiB_s", lambda buf=buf: reader.writes.call_one(buf, reps).get())
    bufs = [owner.make.call_one(16 * MIB).get() for _ in range(batch)]
    attempt(f"batch_{batch}x16MiB_s", lambda: reader.batch.call_one(bufs, reps).get())
    readers.stop().get()
    owners.stop().get()
    return {"figures": figures, "errors": errors}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--tcp", action="store_true")
    p.add_argument("--untagged", action="store_true")
    args = p.parse_args()
    if args.tcp:
        from monarch.config import configure

        configure(read_peer_buffers=False)
        if args.untagged:
            configure(rdma_tcp_integrity=False)
    sizes = [16, 1] if args.quick else [128, 16, 1]
    doc = run(args.reps, sizes, 4 if args.quick else 8, 256 if args.quick else 1024)
    with open(args.json, "w") as f:
        json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
