"""10,000 actors alive at once: the worker side of ``scale_bench.py --actors``.

Written against upstream's public API only, as ``_scale_workload.py`` (whose helpers it
reuses)::

    python _actors_workload.py --procs 256 --meshes 40 --json OUT

Spawns N procs with one sync actor mesh (``base``: the procs' pids, and the memory before
the others), then ``meshes`` actor meshes over them, half sync (``def`` endpoints), half
async (``async def``), each of which answers a gathered ``call()`` before the next is
spawned. Records: the procs' spawn, the actors' spawn (all meshes, each until its first
gathered reply), a gathered call to each mesh in turn (median) and to all meshes at once,
memory (RSS and USS summed over the procs) per idle actor of each kind, and threads per
proc. Standard library only besides monarch (and torch, when importable).
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

from _results import write_result
from _scale_workload import memory_kib, stop_counting, threads

from monarch.actor import Actor, endpoint, this_host


class SyncActor(Actor):
    """A sync actor (``def`` endpoints): idle, it holds its object and its runner."""

    def __init__(self) -> None:
        self.count = 0

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class AsyncActor(Actor):
    """An async actor (``async def`` endpoints)."""

    def __init__(self) -> None:
        self.count = 0

    @endpoint
    async def ping(self) -> str:
        return "pong"


def total_kib(pids: list[int]) -> dict[str, int]:
    """RSS and USS summed over ``pids``."""
    mem = [memory_kib(pid) for pid in pids]
    return {key: sum(m.get(key, 0) for m in mem) for key in ("Rss", "Uss")}


def run(procs_n: int, meshes_n: int, calls: int, timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {"procs": procs_n, "meshes": meshes_n}
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"gpus": procs_n})
    base = procs.spawn("base", SyncActor)
    pids = sorted(base.pid.call().get(timeout).values())
    out["procs_spawn_s"] = time.perf_counter() - t0
    try:
        before = total_kib(pids)
        threads0 = statistics.median(threads(pid) for pid in pids)
        kinds = [("sync", SyncActor), ("async", AsyncActor)]
        meshes: dict[str, list[Any]] = {"sync": [], "async": []}
        mem: dict[str, dict[str, int]] = {}
        spawn_s = 0.0
        for kind, cls in kinds:  # sync first, then async: each kind's memory apart
            t0 = time.perf_counter()
            for i in range(meshes_n // 2):
                mesh = procs.spawn(f"{kind}{i}", cls)
                values = mesh.ping.call().get(timeout).values()
                if len(values) != procs_n or set(values) != {"pong"}:
                    raise AssertionError(f"{kind}{i} gathered {len(values)} values")
                meshes[kind].append(mesh)
            spawn_s += time.perf_counter() - t0
            mem[kind] = total_kib(pids)
            out[f"proc_threads_after_{kind}"] = statistics.median(threads(pid) for pid in pids)
        actors = procs_n * (meshes_n // 2)
        out["actors"] = 2 * actors + procs_n  # and the base mesh
        out["actors_spawn_s"] = spawn_s
        for key in ("Rss", "Uss"):
            sync_kib = mem["sync"][key] - before[key]
            async_kib = mem["async"][key] - mem["sync"][key]
            out[f"sync_actor_{key.lower()}_KiB"] = sync_kib / actors
            out[f"async_actor_{key.lower()}_KiB"] = async_kib / actors
        out["proc_threads_before"] = threads0
        everyone = meshes["sync"] + meshes["async"]
        samples = []
        for _ in range(calls):
            for mesh in everyone:
                c0 = time.perf_counter()
                mesh.ping.call().get(timeout)
                samples.append(time.perf_counter() - c0)
        out["cast_ms"] = statistics.median(samples) * 1e3
        out["cast_ms_p90"] = statistics.quantiles(samples, n=10)[-1] * 1e3
        rounds = []
        for _ in range(calls):
            c0 = time.perf_counter()
            futures = [mesh.ping.call() for mesh in everyone]
            for future in futures:
                future.get(timeout)
            rounds.append(time.perf_counter() - c0)
        out["cast_all_ms"] = statistics.median(rounds) * 1e3
        out["proc_rss_MiB"] = statistics.median(
            m.get("Rss", 0) / 1024 for m in map(memory_kib, pids)
        )
    finally:
        out.update(stop_counting(procs, pids, timeout))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--procs", type=int, required=True)
    p.add_argument("--meshes", type=int, default=40, help="actor meshes, half sync, half async")
    p.add_argument("--calls", type=int, default=5, help="rounds of gathered calls timed")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    return write_result(args.json, lambda: run(args.procs, args.meshes, args.calls, args.timeout))


if __name__ == "__main__":
    sys.exit(main())
