"""A round trip against where the scheduler puts each process's threads (sessions 45-46).

A no-op ``call_one().get()`` to a proc involves four threads: the caller and the client
runtime's loop, the proc's loop and its actor's thread. On this 2-CPU VM it takes ~60 us
when each process's two threads share a CPU and ~200 us when they sit on different ones
(the GIL handed across CPUs). This measures it under four placements, alternated, each on
a fresh proc:

* ``natural``: what users get: each runtime's loop follows the CPU of the thread that
  waits for it (``loop_follows_waiter``, monarch-core's ``_placement``),
* ``unfollowed``: nothing pinned, the loops not following (``loop_follows_waiter`` off:
  bimodal between the two below),
* ``together``: the client's threads pinned to one CPU, the proc's to another,
* ``apart``: each process's threads pinned across both CPUs.

``unfollowed``, ``together`` and ``apart`` run with ``loop_follows_waiter`` off in the
client and the proc (the benchmark's pins then stay as set). Every repetition records the
median round trip and, per thread, its exact CPU time (``/proc/.../schedstat``) and last
CPU. Nothing is asserted; it writes one JSON result::

    hatch run bench:placement --runs 2 --reps 6 --calls 1000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import RESULTS_DIR, machine_info, write_json  # noqa: E402

PLACEMENTS = ("natural", "unfollowed", "together", "apart")


def threads_of(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def thread_state(pid: int, tid: int) -> tuple[float, int]:
    """A thread's exact CPU time (s) and the CPU it last ran on."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
        runtime = int(f.read().split()[0]) / 1e9
    with open(f"/proc/{pid}/task/{tid}/stat") as f:
        cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    return runtime, cpu


def pin(pid: int, placement: str, home: int, cpus: list[int]) -> None:
    """Pin ``pid``'s threads: all on ``home`` (together), its main thread on ``home`` and
    the others on another CPU (apart), or on every CPU (natural)."""
    other = next(c for c in cpus if c != home)
    for tid in threads_of(pid):
        if placement in ("natural", "unfollowed"):
            mask = set(cpus)
        elif placement == "together":
            mask = {home}
        else:
            mask = {home} if tid == pid else {other}
        os.sched_setaffinity(tid, mask)


def measure(placement: str, reps: int, calls: int, cpus: list[int]) -> list[dict[str, Any]]:
    from monarch.actor import this_host
    from monarch.config import configured

    follows = placement == "natural"
    with configured(loop_follows_waiter=follows):  # the procs take the client's setting
        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            return _measure(procs, placement, reps, calls, cpus)
        finally:
            if not follows:  # this benchmark's pins off (not the runtime's own)
                pin(os.getpid(), "natural", cpus[0], cpus)
            procs.stop().get(timeout=60)


def _measure(
    procs: Any, placement: str, reps: int, calls: int, cpus: list[int]
) -> list[dict[str, Any]]:
    from _actor_workloads import Echo

    pinger = procs.spawn("pinger", Echo)
    proc_pid = pinger.pid.call_one().get(timeout=60)
    for _ in range(100):
        pinger.ping.call_one().get(timeout=60)
    me = os.getpid()
    if placement != "natural":
        pin(me, placement, cpus[1], cpus)
        pin(proc_pid, placement, cpus[0], cpus)
    out = []
    for _ in range(reps):
        tids = {me: threads_of(me), proc_pid: threads_of(proc_pid)}
        before = {(p, t): thread_state(p, t) for p, ts in tids.items() for t in ts}
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            pinger.ping.call_one().get(timeout=60)
            samples.append(time.perf_counter() - t0)
        threads = []
        for (p, t), (cpu0, _) in before.items():
            try:
                cpu1, last = thread_state(p, t)
            except OSError:  # ended meanwhile
                continue
            used = (cpu1 - cpu0) / calls * 1e6
            if used >= 1.0:  # the threads that took part
                side = "client" if p == me else "proc"
                threads.append({"side": side, "tid": t, "cpu_us": used, "last_cpu": last})
        out.append({"median_us": statistics.median(samples) * 1e6, "threads": threads})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="rounds of all placements, alternated")
    p.add_argument("--reps", type=int, default=6, help="repetitions per placement and run")
    p.add_argument("--calls", type=int, default=1000, help="round trips per repetition")
    p.add_argument(
        "--placements",
        default=",".join(PLACEMENTS),
        help=f"comma-separated, of {', '.join(PLACEMENTS)}",
    )
    p.add_argument("--out", default=str(RESULTS_DIR / "placement.json"))
    args = p.parse_args(argv)
    chosen = tuple(name for name in args.placements.split(",") if name)
    unknown = sorted(set(chosen) - set(PLACEMENTS))
    if unknown:
        sys.exit(f"unknown placements {', '.join(unknown)}; choose from {', '.join(PLACEMENTS)}")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("placement_bench needs at least 2 usable CPUs")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    for run in range(args.runs):
        order = chosen if run % 2 == 0 else tuple(reversed(chosen))
        for name in order:
            results[name].extend(measure(name, args.reps, args.calls, cpus[:2]))
            print(
                f"run {run} {name}: "
                + " ".join(f"{r['median_us']:.0f}" for r in results[name][-args.reps :])
                + " us",
                flush=True,
            )
    summary = {
        name: {
            "median_of_medians_us": statistics.median(r["median_us"] for r in reps),
            "min_us": min(r["median_us"] for r in reps),
            "max_us": max(r["median_us"] for r in reps),
        }
        for name, reps in results.items()
    }
    print("\n| placement | median of rep medians | fastest rep | slowest rep |")
    print("|---|---|---|---|")
    for name, s in summary.items():
        print(
            f"| {name} | {s['median_of_medians_us']:.0f} us | {s['min_us']:.0f} us "
            f"| {s['max_us']:.0f} us |"
        )
    doc = {
        "benchmark": "placement",
        "machine": machine_info(),
        "settings": {"runs": args.runs, "reps": args.reps, "calls": args.calls},
        "summary": summary,
        "reps": results,
    }
    print(f"\nJSON written to {write_json(args.out, doc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
