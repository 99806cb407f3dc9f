"""What an RDMABuffer transfer costs from the client, where wall time says little.

On a loaded 2-core machine the wall time of a transfer swings several-fold between runs;
the CPU it takes per byte does not. So this measures, from the client (torch imported
first, as users run), against one proc that owns the buffers:

- the TCP plane (``read_peer_buffers=False``), bytes tagged and untagged: MiB/s and the
  CPU of both processes per GiB moved; and a raw loopback TCP stream's, in this process;
- the memory plane: median ``write_from`` / ``read_into`` times at 1, 16 and 128 MiB, and
  a memcpy of each size in this process.

    python benchmarks/rdma_cost_bench.py [--tcp-mib 16] [--reps 20]

Prints one JSON object. For an A/B against another checkout, run it with that
checkout's ``packages/*/src`` on ``PYTHONPATH`` (procs inherit it), alternating.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:  # as a user's client would: torch first
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - the workloads need no torch
    pass

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _raw_peer import cpu_ticks
from _rdma_workloads import Owner
from rdma_bench import tcp_stream

from monarch.actor import endpoint, this_host
from monarch.config import configured
from monarch.rdma import RDMABuffer

MIB = 1024 * 1024
TICK = os.sysconf("SC_CLK_TCK")
warnings.simplefilter("ignore")


def cpu_here() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_of(pid: int) -> float:
    return cpu_ticks([pid]) / TICK


class Holder(Owner):
    """``rdma_bench``'s owner of buffers, which says its pid (its CPU is read)."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def median_s(run: Callable[[], object], reps: int) -> float:
    run()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def raw_stream(size: int, reps: int) -> dict[str, float]:
    """``rdma_bench``'s raw loopback stream, and the CPU of its two threads per GiB."""
    before = cpu_here()
    figure = tcp_stream(size, reps)
    used = cpu_here() - before
    gib = (reps + 1) * size / MIB / 1024
    return {"mibps": round(figure["median"]), "cpu_ms_per_gib": round(used / gib * 1000)}


def tcp_plane(size: int, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for integrity in (True, False):
        with configured(read_peer_buffers=False, rdma_tcp_integrity=integrity):
            procs = this_host().spawn_procs(per_host={"procs": 1})
            holder = procs.spawn("holder", Holder)
            buf = holder.make.call_one(size).get()
            pid = holder.pid.call_one().get()
            local = memoryview(bytearray(b"\x11") * size)
            for op in ("read", "write"):

                def run(op: str = op, buf: RDMABuffer = buf, local: memoryview = local) -> None:
                    if op == "read":
                        buf.read_into(local).get()
                    else:
                        buf.write_from(local).get()

                run()
                here, there = cpu_here(), cpu_of(pid)
                seconds = median_s(run, reps)
                here, there = cpu_here() - here, cpu_of(pid) - there
                gib = (reps + 1) * size / MIB / 1024
                out[f"{op}_{'tagged' if integrity else 'untagged'}"] = {
                    "mibps": round(size / MIB / seconds),
                    "cpu_ms_per_gib": round((here + there) / gib * 1000),
                    "client": round(here / gib * 1000),
                    "owner": round(there / gib * 1000),
                }
            procs.stop().get()
    out["raw"] = raw_stream(size, reps)
    return out


def _write(buf: RDMABuffer, src: bytearray) -> None:
    buf.write_from(src).get()


def _read(buf: RDMABuffer, dst: bytearray) -> None:
    buf.read_into(dst).get()


def memory_plane() -> dict[str, float]:
    out: dict[str, float] = {}
    procs = this_host().spawn_procs(per_host={"procs": 1})
    holder = procs.spawn("holder", Holder)
    for mib, reps in ((1, 200), (16, 30), (128, 8)):
        size = mib * MIB
        buf = holder.make.call_one(size).get()
        src = bytearray(b"\x33") * size
        dst = bytearray(b"\x44") * size
        runs: dict[str, Callable[[], object]] = {
            "write": functools.partial(_write, buf, src),
            "read": functools.partial(_read, buf, dst),
            "memcpy": functools.partial(dst.__setitem__, slice(None), src),
        }
        for op, run in runs.items():
            out[f"{op}_{mib}MiB_us"] = round(median_s(run, reps) * 1e6, 1)
        if dst[:4] != b"\x33" * 4:
            raise AssertionError("the read did not bring what was written")
    procs.stop().get()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tcp-mib", type=int, default=16)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    doc = {"load": load, "tcp": tcp_plane(args.tcp_mib * MIB, args.reps), "memory": memory_plane()}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
