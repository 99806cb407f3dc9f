"""One run of ``logs_bench.py``: a mesh's output aggregated at the client (public API only,
so the same code runs under upstream 0.7.0).

N procs with log forwarding on, streamed to the client with ``aggregate_window_sec``; each
proc prints K lines at once, alike (a step, a rank, a loss) or random (hex). Meanwhile the
client pings an actor on one proc of another mesh every 10 ms: the latency of those pings
says whether the client's loop kept serving while it grouped the lines. Writes its figures
to ``--json FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import time
from typing import Any

from monarch.actor import Actor, current_rank, endpoint, this_host
from monarch.config import configure


class Printer(Actor):
    @endpoint
    def say(self, count: int, kind: str) -> None:
        rank = current_rank().rank
        for i in range(count):
            if kind == "alike":
                print(f"step {i} rank {rank} loss {1.0 / (i + 1 + rank):.6f}", flush=True)
            else:
                print(secrets.token_hex(24), flush=True)


class Pinger(Actor):
    @endpoint
    def ping(self) -> None:
        pass


async def probe(pinger: Any, until: float, samples: list[float]) -> None:
    while time.perf_counter() < until:
        t = time.perf_counter()
        await pinger.ping.call_one()
        samples.append(time.perf_counter() - t)
        await asyncio.sleep(0.01)


async def main(args: argparse.Namespace) -> dict[str, object]:
    configure(enable_log_forwarding=True)
    procs = this_host().spawn_procs(per_host={"gpus": args.procs})
    other = this_host().spawn_procs(per_host={"gpus": 1})
    await procs.logging_option(stream_to_client=True, aggregate_window_sec=args.window)
    printers = procs.spawn("printers", Printer)
    pinger = other.spawn("pinger", Pinger)
    await printers.say.call(0, args.kind)
    await pinger.ping.call_one()
    samples: list[float] = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    until = t0 + args.window + args.settle
    probing = asyncio.ensure_future(probe(pinger, until, samples))
    await printers.say.call(args.lines, args.kind)
    burst = time.perf_counter() - t0
    await probing
    cpu = time.process_time() - cpu0
    await procs.stop()
    await other.stop()
    samples.sort()
    return {
        "procs": args.procs,
        "lines_per_proc": args.lines,
        "kind": args.kind,
        "burst_s": burst,
        "client_cpu_s": cpu,
        "ping_p50_ms": statistics.median(samples) * 1e3,
        "ping_max_ms": samples[-1] * 1e3,
        "pings": len(samples),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=256)
    p.add_argument("--lines", type=int, default=10)
    p.add_argument("--kind", choices=("alike", "random"), default="alike")
    p.add_argument("--window", type=int, default=1, help="seconds (upstream takes an int)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds probed after the window")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the aggregated blocks: not measured
    doc = asyncio.run(main(args))
    with open(args.json, "w") as f:
        json.dump(doc, f)
