"""Jobs: a script's ProcessJob from process start to its first replies, fresh and re-attached.

Run with ``hatch run bench:jobs [--reps N] [--out PATH]``. Each repetition runs a user's
script (``_jobs_client.py``, upstream's API only) three times in a fresh folder: the first
run starts two ``ProcessJob`` hosts and saves the job; the second finds the saved job and
re-attaches to the running hosts; a third kills them. Ours and upstream 0.7.0 (when
``benchmarks/.venvs/upstream`` exists) alternate repetitions. Figures: seconds from the
process's start, and from ``state()``, to the first reply of an actor on every host.
Targets (issue 16): ours <= 0.5x upstream's, fresh and re-attached. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import (
    RESULTS_DIR,
    fmt_num,
    machine_info,
    markdown_table,
    package_versions,
    ratio_entry,
    summarize,
    write_json,
)

HERE = Path(__file__).resolve().parent
PYCACHE = tempfile.mkdtemp(prefix="jobs-bench-pycache-")
ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "PYTHONPYCACHEPREFIX": PYCACHE,
}
"""Every run (and the workers and procs it starts) with a bytecode cache, filled by the
untimed first repetition: editable installs have none, and where PYTHONDONTWRITEBYTECODE
is set every import would compile its module again (a wheel's is compiled at install)."""
CLIENT = HERE / "_jobs_client.py"
UPSTREAM = HERE / ".venvs" / "upstream" / "bin" / "python"
FIGURES = [
    ("fresh", "from_process_start", "fresh job: process start to first replies"),
    ("fresh", "from_state", "fresh job: state() to first replies"),
    ("reattach", "from_process_start", "re-attach: process start to first replies"),
    ("reattach", "from_state", "re-attach: state() to first replies"),
]


def one(python: str, folder: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, str(CLIENT), *args],
        cwd=folder,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} {' '.join(args)} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def repetition(python: str) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="jobs-bench-") as folder:
        path = Path(folder)
        try:
            fresh = one(python, path, "run", repr(time.time()))
            reattach = one(python, path, "run", repr(time.time()))
        finally:
            one(python, path, "kill")
    return {"fresh": fresh, "reattach": reattach}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS_DIR / "jobs.json"))
    parser.add_argument("--upstream-python", default=str(UPSTREAM))
    args = parser.parse_args()
    impls = {"monarch": sys.executable}
    if Path(args.upstream_python).exists():
        impls["upstream"] = args.upstream_python
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in impls}
    errors: dict[str, str] = {}
    for rep in range(args.reps + 1):  # the first, untimed: bytecode caches, page cache
        for name, python in impls.items():
            if name in errors:
                continue
            try:
                result = repetition(python)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                errors[name] = str(exc)
                continue
            if rep:
                runs[name].append(result)
            print(f"rep {rep} {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    figures = []
    for name, reps in runs.items():
        for run, key, label in FIGURES:
            samples = [r[run][key] for r in reps]
            figures.append(
                {
                    "name": f"{run}_{key}",
                    "impl": name,
                    "label": label,
                    "unit": "s",
                    **summarize(samples),
                }
            )
    medians = {(f["name"], f["impl"]): f["median"] for f in figures}
    targets = [
        ratio_entry(
            f"{run}_{key}",
            0.5,
            medians.get((f"{run}_{key}", "monarch")),
            medians.get((f"{run}_{key}", "upstream")),
            higher_is_better=False,
        )
        for run, key, _ in FIGURES
    ]
    doc = {
        "benchmark": "jobs",
        "machine": machine_info(),
        "packages": package_versions(["monarch-core", "monarch-jobs"]),
        "settings": {"reps": args.reps, "hosts": 2, "impls": list(impls), "pycache": PYCACHE},
        "figures": figures,
        "targets": targets,
        "errors": errors,
    }
    out = write_json(args.out, doc)
    rows = []
    for run, key, label in FIGURES:
        ours = medians.get((f"{run}_{key}", "monarch"))
        theirs = medians.get((f"{run}_{key}", "upstream"))
        ratio = ours / theirs if ours and theirs else None
        rows.append([label, fmt_num(ours), fmt_num(theirs), fmt_num(ratio), "<= 0.5x"])
    headers = ["figure (s, median)", "monarch", "upstream 0.7.0", "ratio", "target"]
    print(markdown_table(headers, rows))
    for name, error in errors.items():
        print(f"{name}: failed: {error}")
    print(f"JSON written to {out}")


if __name__ == "__main__":
    main()
