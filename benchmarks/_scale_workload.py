"""One mesh of N procs on this host, measured: the worker side of ``scale_bench.py``.

Written against upstream's public API only (``this_host``, ``spawn_procs``, ``spawn``,
``call``, ``broadcast``, ``get``, ``stop``), so that the very same code measures this
repository's monarch and upstream torchmonarch 0.7.0 (run by ``benchmarks/.venvs/upstream``)::

    python _scale_workload.py --procs 256 --json OUT [--calls 30] [--reps 5]

It imports torch first when it can (a user's script has; upstream's client imports it
anyway), spawns one mesh of N procs with one sync actor each, and records: the spawn (procs,
actors, until the first gathered reply), gathered ``call()`` latency, 20 broadcasts then a
call, the controller's CPU per gathered call and per broadcast, the procs' CPU per gathered
call (per proc), RSS/PSS/USS of each idle proc,
and the stop: its seconds and the procs still alive when it returned and 5 s later.
Standard library only besides monarch (and torch, when importable), and ``_results`` beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

try:  # a user's script has imported torch; upstream's monarch imports it in any case
    import torch  # noqa: F401
except ImportError:
    pass

from _results import cpu_seconds, write_result

from monarch.actor import Actor, endpoint, this_host

BROADCASTS = 20
"""Fire-and-forget casts before the closing call (the issue's "20 broadcasts + a call")."""


class Scale(Actor):
    """A sync actor: what an idle proc holds besides the runtime. Defined here rather
    than imported from ``_actor_workloads`` (its ``Echo``): a class of the main script
    travels by value, so the procs import none of the benchmarks' modules, whose memory
    would count in the idle proc's."""

    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def tick(self) -> None:
        self.count += 1

    @endpoint
    def ticks(self) -> int:
        return self.count

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def memory_kib(pid: int) -> dict[str, int]:
    """Rss, Pss and USS (private clean + dirty) of a process, from ``smaps_rollup``."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                    out[key] = int(value.split()[0])
    except OSError:
        return {}
    out["Uss"] = out.pop("Private_Clean", 0) + out.pop("Private_Dirty", 0)
    return out


def threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (a zombie has ended: its parent only has not reaped it)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def run(procs_n: int, calls: int, reps: int, timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {"procs": procs_n}
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"gpus": procs_n})
    actors = procs.spawn("scale", Scale)
    pids = sorted(actors.pid.call().get(timeout).values())
    out["spawn_s"] = time.perf_counter() - t0
    if len(set(pids)) != procs_n:
        raise AssertionError(f"{len(set(pids))} distinct pids for {procs_n} procs")
    try:
        ping = actors.ping
        for _ in range(3):  # prime: connections, code paths
            ping.call().get(timeout)
        samples = []
        cpu0, procs_cpu0 = time.process_time(), cpu_seconds(pids)
        for _ in range(calls):
            c0 = time.perf_counter()
            values = ping.call().get(timeout).values()
            samples.append(time.perf_counter() - c0)
        out["call_cpu_ms"] = (time.process_time() - cpu0) / calls * 1e3
        out["procs_cpu_us"] = (cpu_seconds(pids) - procs_cpu0) / calls / procs_n * 1e6
        if len(values) != procs_n or set(values) != {"pong"}:
            raise AssertionError(f"gathered {len(values)} values, not {procs_n} x 'pong'")
        out["call_ms"] = median_ms(samples)
        out["call_ms_samples"] = [s * 1e3 for s in samples]
        bursts, bcast_cpu = [], []
        tick = actors.tick
        before = list(actors.ticks.call().get(timeout).values())
        for _ in range(reps):
            cpu0, c0 = time.process_time(), time.perf_counter()
            for _ in range(BROADCASTS):
                tick.broadcast()
            after = list(actors.ticks.call().get(timeout).values())
            bursts.append(time.perf_counter() - c0)
            bcast_cpu.append((time.process_time() - cpu0) / (BROADCASTS + 1))
            grew = {a - b for a, b in zip(after, before, strict=True)}
            if grew != {BROADCASTS}:
                raise AssertionError(f"the closing call saw {sorted(grew)[:5]} ticks per proc")
            before = after
        out["bcast20_ms"] = median_ms(bursts)
        out["bcast20_ms_samples"] = [s * 1e3 for s in bursts]
        out["bcast_cpu_ms"] = statistics.median(bcast_cpu) * 1e3
        mem = [memory_kib(pid) for pid in pids]
        for key in ("Rss", "Pss", "Uss"):
            got = [m[key] / 1024 for m in mem if key in m]
            out[f"proc_{key.lower()}_MiB"] = statistics.median(got) if got else None
        out["proc_threads"] = statistics.median(threads(pid) for pid in pids)
        out["controller_rss_MiB"] = memory_kib(os.getpid()).get("Rss", 0) / 1024
    finally:
        out.update(stop_counting(procs, pids, timeout))
    return out


def stop_counting(procs: Any, pids: list[int], timeout: float) -> dict[str, Any]:
    """Stop ``procs``: how long ``stop()`` took, and how many of ``pids`` were left when
    it returned and 5 s after."""
    s0 = time.perf_counter()
    procs.stop().get(timeout)
    out: dict[str, Any] = {"stop_s": time.perf_counter() - s0, "left_at_stop": len(alive(pids))}
    deadline = time.monotonic() + 5.0
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    out["left_after_5s"] = len(alive(pids))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--procs", type=int, required=True)
    p.add_argument("--calls", type=int, default=30, help="gathered calls timed")
    p.add_argument("--reps", type=int, default=5, help="rounds of 20 broadcasts + a call")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    return write_result(args.json, lambda: run(args.procs, args.calls, args.reps, args.timeout))


if __name__ == "__main__":
    sys.exit(main())
