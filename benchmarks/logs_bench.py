"""Procs' output aggregated at the client: its cost, and whether the client keeps serving.

Runs ``_logs_workload.py`` (a fresh client per run) for ours, a baseline (``--baseline REV``:
that commit's packages from ``git archive`` on ``PYTHONPATH``) and upstream 0.7.0, alternated,
for alike and random lines; reports each run's client CPU and the latency of pings to another
actor during the burst (median and worst). Nothing is asserted: it writes one JSON result::

    hatch run bench:logs --procs 256 --lines 10 --runs 2 --baseline c68c284
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import RESULTS_DIR, machine_info, run_workload, write_json  # noqa: E402
from baselines import default_python  # noqa: E402

WORKLOAD = HERE / "_logs_workload.py"


def baseline_path(rev: str, into: Path) -> str:
    """``rev``'s packages, extracted under ``into``: a ``PYTHONPATH`` of their ``src``."""
    archive = subprocess.run(
        ["git", "archive", rev, "packages"], cwd=HERE.parent, capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return os.pathsep.join(str(p) for p in sorted((into / "packages").glob("*/src")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--procs", type=int, default=256)
    p.add_argument("--lines", type=int, default=10, help="lines each proc prints at once")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--baseline", default="", help="a git revision to run beside ours")
    p.add_argument("--no-upstream", action="store_true")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(RESULTS_DIR / "logs.json"))
    args = p.parse_args(argv)
    ours_env = {**os.environ, "MONARCH_PROC_PRELOAD": ""}
    sides: list[tuple[str, str, dict[str, str]]] = [("ours", sys.executable, ours_env)]
    with tempfile.TemporaryDirectory(prefix="logs-bench-") as tmp:
        if args.baseline:
            base = baseline_path(args.baseline, Path(tmp))
            sides.append(("baseline", sys.executable, {**ours_env, "PYTHONPATH": base}))
        upstream = None if args.no_upstream else default_python("upstream")
        if upstream is not None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
            sides.append(("upstream", str(upstream), env))
        started = time.perf_counter()
        runs: list[dict[str, Any]] = []
        for _ in range(args.runs):
            for kind in ("alike", "random"):
                for side, python, env in sides:
                    argv_ = ["--procs", str(args.procs), "--lines", str(args.lines), "--kind", kind]
                    doc = run_workload(python, WORKLOAD, argv_, env, args.timeout)
                    doc.update(side=side, kind=kind)
                    runs.append(doc)
                    shown = {k: round(v, 2) for k, v in doc.items() if isinstance(v, float)}
                    print(side, kind, shown, doc.get("error", ""), flush=True)
    figures: dict[str, Any] = {}
    for side in {r["side"] for r in runs}:
        for kind in ("alike", "random"):
            mine = [r for r in runs if r["side"] == side and r["kind"] == kind and "error" not in r]
            if mine:
                figures[f"{side}/{kind}"] = {
                    key: statistics.median(r[key] for r in mine)
                    for key in ("client_cpu_s", "ping_p50_ms", "ping_max_ms", "burst_s")
                }
    doc = {
        "benchmark": "logs",
        "machine": machine_info(),
        "settings": vars(args),
        "duration_s": time.perf_counter() - started,
        "figures": figures,
        "runs": runs,
    }
    print(write_json(args.out, doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
