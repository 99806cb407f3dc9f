"""A worker's memory with torch, ours against upstream 0.7.0: RSS, PSS and USS.

Run with ``hatch run bench:memory [--procs N] [--out PATH]``. A proc forked by a zygote
that has imported torch shares torch's pages with that zygote and its siblings: its RSS
counts them whole, as if it alone held them; its PSS counts its share; its USS (private
clean + private dirty, ``/proc/<pid>/smaps_rollup``) only what is its own, what one more
such proc costs the machine. An upstream proc starts as a new process and imports torch
itself: only the files it maps (shared libraries) are shared, so its RSS is what it costs
and the figure to compare with ours is PSS (what each proc costs when N run) or USS (what
one more costs).

Each implementation runs ``python memory_bench.py --child`` (upstream's API only) in a
fresh process: the client imports torch first, spawns N procs and
``import torch`` in each through an endpoint, then reads each proc's figures. Ours is run
twice: procs spawned at once (the zygote forks them before its successor has imported
torch: each imports it itself, as upstream's do), and procs spawned once a proc forked
by the successor finds torch imported at its start (they share it). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if "--child" in sys.argv:
    import torch  # noqa: F401 - a PyTorch user's script imports it first

from monarch.actor import Actor, endpoint, this_host

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / ".venvs" / "upstream" / "bin" / "python"


def smaps(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of a process, in MiB."""
    kib: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                kib[key] = int(value.split()[0])
    uss = kib.get("Private_Clean", 0) + kib.get("Private_Dirty", 0)
    return {"rss": kib["Rss"] / 1024, "pss": kib["Pss"] / 1024, "uss": uss / 1024}


class Torch(Actor):
    @endpoint
    def start(self) -> tuple[int, bool]:
        """This proc's pid, and whether torch was imported before any call (preloaded)."""
        return os.getpid(), "torch" in sys.modules

    @endpoint
    def load(self) -> int:
        import torch

        return int(torch.ones(4).sum().item())


def child(count: int, shared: bool) -> None:
    if shared:  # wait (on a condition, with a deadline) for the zygote's successor
        deadline = time.monotonic() + 300
        while True:
            probe = this_host().spawn_procs(per_host={"gpus": 1})
            _, found = probe.spawn("t", Torch).start.call_one().get(timeout=300)
            probe.stop().get(timeout=60)
            if found or time.monotonic() > deadline:
                break
    procs = this_host().spawn_procs(per_host={"gpus": count})
    mesh = procs.spawn("t", Torch)
    started = list(mesh.start.call().get(timeout=300).values())
    assert all(value == 4 for value in mesh.load.call().get(timeout=300).values())
    figures = [{**smaps(pid), "preloaded": preloaded} for pid, preloaded in started]
    print(json.dumps({"procs": figures}), flush=True)
    procs.stop().get(timeout=60)
    os._exit(0)


def run(python: str, env: dict[str, str], count: int, shared: bool) -> dict[str, Any]:
    args = [python, __file__, "--child", "--procs", str(count)] + (["--shared"] if shared else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{python} failed: {done.stderr[-2000:]}")
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("{"))
    result: dict[str, Any] = json.loads(line)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--shared", action="store_true")
    parser.add_argument("--upstream-python", default=str(UPSTREAM))
    parser.add_argument("--out", default=str(HERE / "results" / "worker_memory.json"))
    args = parser.parse_args()
    if args.child:
        child(args.procs, args.shared)
        return
    sys.path.insert(0, str(HERE))
    from _results import machine_info, markdown_table, write_json

    env = {k: v for k, v in os.environ.items() if k != "MONARCH_JOB_SECRET"}
    runs = {
        "monarch, spawned at once (each imports torch)": run(
            sys.executable, env, args.procs, False
        ),
        "monarch, forked with torch preloaded": run(sys.executable, env, args.procs, True),
    }
    if Path(args.upstream_python).exists():
        runs["upstream 0.7.0 (each imports torch)"] = run(
            args.upstream_python, env, args.procs, False
        )
    rows = []
    for name, result in runs.items():
        procs = result["procs"]
        mean = {k: sum(p[k] for p in procs) / len(procs) for k in ("rss", "pss", "uss")}
        result["mean_MiB"] = mean
        preloaded = sum(p["preloaded"] for p in procs)
        rows.append(
            [name, f"{preloaded}/{len(procs)}", *(f"{mean[k]:.0f}" for k in ("rss", "pss", "uss"))]
        )
    out = write_json(args.out, {"benchmark": "memory", "machine": machine_info(), "runs": runs})
    print(
        markdown_table(["procs (mean per proc, MiB)", "torch at start", "RSS", "PSS", "USS"], rows)
    )
    print(f"JSON written to {out}")


if __name__ == "__main__":
    main()
