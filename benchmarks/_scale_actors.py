"""``bench:scale --actors``: 10,000 actors alive at once (issue 34), ours beside baselines.

Each run is a fresh controller running ``_actors_workload.py`` (N procs, ``meshes`` actor
meshes over them, half sync, half async). Sides, alternating in a rotating order:

- ``ours``: sync actors share their process's pool (``sync_actor_threads``, default 16);
- ``ours-thread-each``: ``sync_actor_threads=0``, a thread per sync actor (the model
  before the pool, and upstream's), the baseline of the same run;
- ``upstream``: torchmonarch 0.7.0 (``benchmarks/.venvs/upstream``), at
  ``--actors-upstream-procs`` procs only (at ~110 MiB a proc, 256 do not fit here).

Figures: the procs' spawn, the actors' spawn (all meshes, each until its first gathered
reply), a gathered call to one mesh (median, p90) and to all meshes at once, memory per
idle actor (RSS and USS deltas summed over the procs) of each kind, threads per proc.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from _results import (
    RESULTS_DIR,
    figures_of,
    fmt_num,
    machine_info,
    markdown_table,
    package_versions,
    run_workload,
    write_json,
)
from baselines import default_python

WORKLOAD = Path(__file__).resolve().parent / "_actors_workload.py"

FIGURES: dict[str, tuple[str, str]] = {
    "actors": ("actors", "actors alive at once"),
    "procs_spawn_s": ("s", "spawn the procs (+ a base actor each)"),
    "actors_spawn_s": ("s", "spawn the actor meshes, each until its first gathered reply"),
    "cast_ms": ("ms", "gathered call() to one mesh, median"),
    "cast_ms_p90": ("ms", "gathered call() to one mesh, p90"),
    "cast_all_ms": ("ms", "gathered call() to every mesh at once"),
    "sync_actor_rss_KiB": ("KiB", "RSS per idle sync actor"),
    "sync_actor_uss_KiB": ("KiB", "USS per idle sync actor"),
    "async_actor_rss_KiB": ("KiB", "RSS per idle async actor"),
    "async_actor_uss_KiB": ("KiB", "USS per idle async actor"),
    "proc_threads_after_sync": ("threads", "threads per proc with the sync actors"),
    "proc_threads_after_async": ("threads", "threads per proc with all actors"),
    "proc_rss_MiB": ("MiB", "RSS per proc with all actors (median)"),
    "stop_s": ("s", "stop()"),
    "left_after_5s": ("procs", "procs alive 5 s after"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--actors", action="store_true", help="the 10,000-actor benchmark instead")
    p.add_argument("--actor-procs", type=int, default=256, help="procs of the actor benchmark")
    p.add_argument("--actor-meshes", type=int, default=40, help="actor meshes (half async)")
    p.add_argument("--actors-upstream-procs", type=int, default=16, help="procs for upstream")
    p.add_argument("--actors-out", default=str(RESULTS_DIR / "actors34_actors.json"))
    p.add_argument(
        "--actor-sides",
        default="ours,ours-thread-each,upstream",
        help="which of the sides run (comma-separated)",
    )


def measure(python: str, procs: int, env: dict[str, str], args: argparse.Namespace) -> Any:
    argv = ["--procs", str(procs), "--meshes", str(args.actor_meshes)]
    argv += ["--timeout", str(args.timeout)]
    return run_workload(python, WORKLOAD, argv, env, args.timeout)


def main(args: argparse.Namespace) -> int:
    upstream = None if args.no_upstream else default_python("upstream")
    spawn_timeout = {"HYPERACTOR_HOST_SPAWN_READY_TIMEOUT": f"{int(args.timeout)}s"}
    ours_env = {**os.environ, "MONARCH_PROC_PRELOAD": "", **spawn_timeout}
    each_env = {**ours_env, "MONARCH_SYNC_ACTOR_THREADS": "0"}
    up_env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    up_env.update(spawn_timeout)
    wanted = set(args.actor_sides.split(","))
    sides: list[tuple[str, str, dict[str, str], int]] = [
        ("ours", sys.executable, ours_env, args.actor_procs),
        ("ours-thread-each", sys.executable, each_env, args.actor_procs),
    ]
    sides = [side for side in sides if side[0] in wanted]
    if upstream is not None and "upstream" in wanted:  # and ours at its size
        sides.append(("upstream", str(upstream), up_env, args.actors_upstream_procs))
        sides.append(("ours", sys.executable, ours_env, args.actors_upstream_procs))
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for turn in range(args.runs):
        order = sides[turn % len(sides) :] + sides[: turn % len(sides)]
        for name, python, env, procs in order:
            got = measure(python, procs, env, args)
            runs.append({"side": name, **got, "procs": procs})
            brief = got.get("error") or (
                f"{got['actors']} actors: spawn {got['actors_spawn_s']:.2f} s, cast "
                f"{got['cast_ms']:.1f} ms, sync {got['sync_actor_uss_KiB']:.0f} KiB, "
                f"async {got['async_actor_uss_KiB']:.0f} KiB USS per actor"
            )
            elapsed = time.perf_counter() - started
            print(f"[{elapsed:6.1f}s] {name} {procs}: {brief}", file=sys.stderr, flush=True)
    figures = figures_of(runs, sorted({(s[0], s[3]) for s in sides}), FIGURES)
    doc = {
        "benchmark": "scale-actors",
        "machine": machine_info(),
        "packages": package_versions(["monarch-core", "monarch-transport"]),
        "settings": {
            "procs": args.actor_procs,
            "meshes": args.actor_meshes,
            "upstream_procs": args.actors_upstream_procs,
            "runs": args.runs,
            "upstream": str(upstream) if upstream else None,
        },
        "duration_s": round(time.perf_counter() - started, 1),
        "figures": figures,
        "runs": runs,
    }
    path = write_json(args.actors_out, doc)
    print(render(doc))
    print(f"\nJSON written to {path}", file=sys.stderr)
    return 0


def render(doc: dict[str, Any]) -> str:
    columns = sorted({(f["side"], f["procs"]) for f in doc["figures"]}, key=lambda c: -c[1])
    by = {(f["side"], f["procs"], f["name"]): f["median"] for f in doc["figures"]}
    headers = ["figure", "unit"] + [f"{side} ({procs} procs)" for side, procs in columns]
    rows = [
        [label, unit] + [fmt_num(by.get((side, procs, key))) for side, procs in columns]
        for key, (unit, label) in FIGURES.items()
    ]
    m = doc["machine"]
    lines = [
        f"## {doc['settings']['meshes']} actor meshes over N procs ({m.get('cpu_count')} "
        f"CPUs, load {m.get('load_average')}, {doc['duration_s']} s)",
        "",
        markdown_table(headers, rows),
    ]
    errors = [f"- {r['side']} {r['procs']}: {r['error']}" for r in doc["runs"] if "error" in r]
    return "\n".join(lines + (["", *errors] if errors else []))
