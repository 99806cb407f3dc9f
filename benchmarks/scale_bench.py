"""One mesh of N procs on this machine, at N = 16, 64, 256 (and 1024): ours beside upstream.

Run with ``hatch run bench:scale [--sizes 16,64,256,1024] [--runs 2] [--floor] [--out PATH]``. Each
measurement is a fresh controller process running ``_scale_workload.py`` (upstream's public
API only), in this environment and, where ``benchmarks/.venvs/upstream`` exists (made by
``baselines.py``), in upstream torchmonarch 0.7.0's, the two alternating in a rotating order.
Upstream runs only up to ``--upstream-max`` procs (default 256: at ~110 MiB RSS a proc, more
does not fit a small machine).

Our procs are measured idle without torch (``MONARCH_PROC_PRELOAD=""``: the controller has
imported torch, which by default has the zygote preload it for every proc; this benchmark is
about what a proc costs without it). Figures per size (see ``_scale_workload.py``): spawn s,
gathered ``call()`` ms, 20 broadcasts + a call ms, the controller's CPU per gathered call and
per broadcast, RSS/PSS/USS and threads per idle proc, stop s and the procs left behind.
The targets are issue 34's. Nothing here asserts on speed.

``--floor``: beside ours, the machine's floor for the same gathered call (``_scale_floor.py``:
N forked Python procs, each an event loop that hands the message to a second thread, which
answers; no framing, serialization, routing or supervision): its latency and the procs' CPU
per call, what any Python framework with our structure pays at least here.

``--actors``: 10,000 actors alive at once instead (40 meshes over 256 procs, sync and
async; see ``_scale_actors.py``), JSON in ``results/actors34_actors.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _scale_actors
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

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "_scale_workload.py"
FLOOR = HERE / "_scale_floor.py"

FIGURES: dict[str, tuple[str, str]] = {
    "spawn_s": ("s", "spawn N procs + actors + first gathered reply"),
    "call_ms": ("ms", "gathered call() to all, median"),
    "bcast20_ms": ("ms", "20 broadcasts + a call, median"),
    "call_cpu_ms": ("ms", "controller CPU per gathered call"),
    "procs_cpu_us": ("us", "procs' CPU per gathered call, per proc"),
    "bcast_cpu_ms": ("ms", "controller CPU per broadcast"),
    "proc_rss_MiB": ("MiB", "RSS per idle proc (median)"),
    "proc_pss_MiB": ("MiB", "PSS per idle proc (median)"),
    "proc_uss_MiB": ("MiB", "USS per idle proc (median)"),
    "proc_threads": ("threads", "threads per idle proc"),
    "controller_rss_MiB": ("MiB", "controller RSS"),
    "stop_s": ("s", "stop()"),
    "left_at_stop": ("procs", "procs alive when stop() returned"),
    "left_after_5s": ("procs", "procs alive 5 s after"),
}
TARGETS: list[tuple[str, int | None, str, float]] = [
    # (figure, procs (None: every size), op, bound): issue 34's goals for ours
    ("spawn_s", 1024, "<=", 5.0),
    ("call_ms", 1024, "<=", 100.0),
    ("stop_s", 1024, "<=", 3.0),
    ("left_after_5s", None, "<=", 0),
    ("proc_rss_MiB", None, "<=", 15.0),
    ("call_ms", 256, "<=", 30.0),
]


def measure(
    side: str, python: str, procs: int, env: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    argv = ["--procs", str(procs), "--calls", str(args.calls)]
    if side == "floor":
        return run_workload(python, FLOOR, argv, env, args.timeout)
    return run_workload(python, WORKLOAD, [*argv, "--reps", str(args.reps)], env, args.timeout)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--sizes", default="16,64,256", help="procs per mesh, comma-separated")
    p.add_argument("--runs", type=int, default=1, help="fresh controllers per size and side")
    p.add_argument("--calls", type=int, default=30, help="gathered calls timed per run")
    p.add_argument("--reps", type=int, default=5, help="rounds of 20 broadcasts + a call")
    p.add_argument("--upstream-max", type=int, default=256, help="largest mesh upstream runs")
    p.add_argument("--no-upstream", action="store_true")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also the machine's floor (_scale_floor.py: forked procs that only answer)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    p.add_argument("--out", default=str(RESULTS_DIR / "scale.json"))
    _scale_actors.add_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.actors:
        return _scale_actors.main(args)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    upstream = None if args.no_upstream else default_python("upstream")
    # Both read upstream's key: a mesh of 1,024 may take longer than its default 30 s.
    spawn_timeout = {"HYPERACTOR_HOST_SPAWN_READY_TIMEOUT": f"{int(args.timeout)}s"}
    ours_env = {**os.environ, "MONARCH_PROC_PRELOAD": "", **spawn_timeout}
    up_env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    up_env.update(spawn_timeout)
    sides: list[tuple[str, str, dict[str, str]]] = [("ours", sys.executable, ours_env)]
    if upstream is not None:
        sides.append(("upstream", str(upstream), up_env))
    if args.floor:
        sides.append(("floor", sys.executable, dict(os.environ)))
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    turn = 0
    for procs in sizes:
        for _ in range(args.runs):
            order = sides[turn % len(sides) :] + sides[: turn % len(sides)]
            turn += 1
            for name, python, env in order:
                if name == "upstream" and procs > args.upstream_max:
                    continue
                got = measure(name, python, procs, env, args)
                runs.append({"side": name, "procs": procs, **got})
                brief = got.get("error") or (
                    f"call {got['call_ms']:.1f} ms, procs' CPU {got['procs_cpu_us']:.0f} us"
                    if name == "floor"
                    else f"spawn {got['spawn_s']:.2f} s, call {got['call_ms']:.1f} ms, "
                    f"rss {got['proc_rss_MiB']:.1f} MiB, stop {got['stop_s']:.2f} s"
                )
                elapsed = time.perf_counter() - started
                print(f"[{elapsed:6.1f}s] {name} {procs}: {brief}", file=sys.stderr, flush=True)
    figures = figures_of(runs, [(name, n) for name, _, _ in sides for n in sizes], FIGURES)
    doc = {
        "benchmark": "scale",
        "machine": machine_info(),
        "packages": package_versions(["monarch-core", "monarch-transport"]),
        "settings": {
            "sizes": sizes,
            "runs": args.runs,
            "calls": args.calls,
            "reps": args.reps,
            "upstream_max": args.upstream_max,
            "upstream": str(upstream) if upstream else None,
            "floor": args.floor,
        },
        "duration_s": round(time.perf_counter() - started, 1),
        "figures": figures,
        "targets": targets(figures),
        "runs": runs,
    }
    path = write_json(args.out, doc)
    print(render(doc))
    print(f"\nJSON written to {path}", file=sys.stderr)
    return 0


def targets(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    median = {(f["procs"], f["name"]): f["median"] for f in figures if f["side"] == "ours"}
    out = []
    for name, procs, op, bound in TARGETS:
        for (size, key), value in sorted(median.items()):
            if key == name and (procs is None or size == procs):
                out.append(
                    {"name": name, "procs": size, "op": op, "bound": bound, "ours": value}
                    | {"pass": value <= bound}
                )
    return out


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    sizes = doc["settings"]["sizes"]
    sides = ["ours", "upstream"] + (["floor"] if doc["settings"].get("floor") else [])
    by = {(f["side"], f["procs"], f["name"]): f["median"] for f in doc["figures"]}
    headers = ["figure", "unit"] + [f"{n} ({' / '.join(sides)})" for n in sizes]
    rows = []
    for key, (unit, label) in FIGURES.items():
        row = [label, unit]
        for n in sizes:
            row.append(" / ".join(fmt_num(by.get((side, n, key))) for side in sides))
        rows.append(row)
    lines = [
        f"## One mesh of N procs on this machine ({m.get('cpu_count')} CPUs, "
        f"load {m.get('load_average')}, {doc['duration_s']} s)",
        "",
        markdown_table(headers, rows),
        "",
        markdown_table(
            ["target (ours)", "procs", "want", "measured", "pass"],
            [
                [t["name"], t["procs"], f"{t['op']} {t['bound']}", fmt_num(t["ours"]), t["pass"]]
                for t in doc["targets"]
            ],
        ),
    ]
    errors = [f"- {r['side']} {r['procs']}: {r['error']}" for r in doc["runs"] if "error" in r]
    if errors:
        lines += ["", *errors]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
