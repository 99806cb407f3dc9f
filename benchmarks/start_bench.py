"""Proc start: a script's cold start and a fresh ProcessJob, against a baseline and upstream.

Run with ``hatch run bench:start [--reps N] [--baseline DIR] [--out PATH]``. Two workloads,
each in fresh processes, as ``bench:core`` (cold start) and ``bench:jobs`` (fresh job) run
them:

* cold start (``_core_cold_start.py``): a fresh Python imports ``monarch.actor``, spawns
  1 proc with 1 actor and gets its first reply; seconds from the process's start and from
  the spawn call;
* fresh job (``_jobs_client.py run``, in a fresh folder, then ``kill``):
  ``ProcessJob({"hosts": 2}).state()``, one proc per host, one actor each, the first
  replies; seconds from ``state()`` and from the process's start.

With torch imported by the client first, as a PyTorch user's script does (issue 29):
``cold_start_torch`` (1 proc) and ``cold_start_torch4`` (4 procs), spawn call to first
reply; ``tensor_start`` (``_tensor_cold_start.py``: ``spawn_procs(gpus=2).initialized``,
then the first value fetched from the mesh); ``local_job_torch`` (``LocalJob().state()``
to the first reply) and ``fresh_job_torch`` (``ProcessJob({"hosts": 2})``, as fresh job);
``tensor_start_after_work``: ``tensor_start`` where the script works (torch on the client)
for ``WORK_S`` between its imports and the spawn, as most scripts do before they spawn.

Implementations: ``monarch`` (this checkout, as installed), ``baseline`` (with
``--baseline DIR``: the same interpreter with DIR's ``packages/*/src`` first on
``PYTHONPATH``, e.g. a worktree of main: before/after in one run) and ``upstream``
(torchmonarch 0.7.0 from ``benchmarks/.venvs/upstream``, when there). Every repetition
runs each workload once per implementation, in an order that rotates with the repetition,
so a drift in the machine's load hits all alike; the first repetition is untimed (it
fills the bytecode cache: editable installs have none). Nothing is asserted.
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
    ratio_entry,
    summarize,
    write_json,
)

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / ".venvs" / "upstream" / "bin" / "python"
FIGURES = {
    "cold_start_process_s": "cold start: process start to first reply",
    "cold_start_spawn_s": "cold start: spawn call to first reply",
    "cold_start_torch_spawn_s": "cold start, torch first: spawn call to first reply",
    "cold_start_torch4_spawn_s": "cold start, torch first, 4 procs: spawn to first reply",
    "tensor_initialized_s": "tensor engine, torch first: spawn_procs(2) to initialized",
    "tensor_first_value_s": "tensor engine: initialized to the first fetched value",
    "tensor_first_value_after_work_s": "the same, the script having worked 2 s before it spawned",
    "local_job_torch_s": "LocalJob, torch first: state() to first reply",
    "jobs_fresh_from_state_s": "fresh ProcessJob (2 hosts): state() to first replies",
    "jobs_fresh_from_process_start_s": "fresh ProcessJob (2 hosts): process start to replies",
    "jobs_fresh_torch_s": "fresh ProcessJob (2 hosts), torch first: state() to replies",
}
TARGETS = {
    "cold_start_process_s": 1.0,
    "jobs_fresh_from_state_s": 0.5,
    "cold_start_torch_spawn_s": 0.5,
    "cold_start_torch4_spawn_s": 0.5,
    "tensor_initialized_s": 0.5,
    "tensor_first_value_after_work_s": 0.25,
    "local_job_torch_s": 0.5,
    "jobs_fresh_torch_s": 0.5,
}
"""Ours / upstream 0.7.0 (issues 19, 16 and 29)."""

WORK_S = 2.0
"""Seconds the script works before it spawns in ``tensor_start_after_work``."""


class Impl:
    """An interpreter and the environment its processes run with."""

    def __init__(self, name: str, python: str, env: dict[str, str]) -> None:
        self.name = name
        self.python = python
        self.env = env

    def run(self, args: list[str], cwd: str | None = None) -> dict[str, Any]:
        """``python ARGS``; its last JSON line, with the parent's clocks just before."""
        started, wall = time.monotonic(), time.time()
        done = subprocess.run(
            [self.python, *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(args)} failed: {done.stderr[-2000:]}")
        for line in reversed(done.stdout.splitlines()):
            if line.startswith("{"):
                doc: dict[str, Any] = json.loads(line)
                return {**doc, "t_parent": started, "wall_parent": wall}
        raise RuntimeError(f"{self.name}: {' '.join(args)} printed no timings")

    def cold_start(self) -> dict[str, float]:
        doc = self.run([str(HERE / "_core_cold_start.py")])
        return {
            "cold_start_process_s": doc["t_reply"] - doc["t_parent"],
            "cold_start_spawn_s": doc["t_reply"] - doc["t_spawn"],
        }

    def cold_start_torch(self) -> dict[str, float]:
        doc = self.run([str(HERE / "_core_cold_start.py"), "--torch"])
        return {"cold_start_torch_spawn_s": doc["t_reply"] - doc["t_spawn"]}

    def cold_start_torch4(self) -> dict[str, float]:
        doc = self.run([str(HERE / "_core_cold_start.py"), "--torch", "--procs", "4"])
        return {"cold_start_torch4_spawn_s": doc["t_reply"] - doc["t_spawn"]}

    def tensor_start(self) -> dict[str, float]:
        doc = self.run([str(HERE / "_tensor_cold_start.py")])
        return {
            "tensor_initialized_s": doc["t_initialized"] - doc["t_spawn"],
            "tensor_first_value_s": doc["t_value"] - doc["t_initialized"],
        }

    def tensor_start_after_work(self) -> dict[str, float]:
        doc = self.run([str(HERE / "_tensor_cold_start.py"), "--work", str(WORK_S)])
        return {"tensor_first_value_after_work_s": doc["t_value"] - doc["t_initialized"]}

    def _job(self, *words: str) -> dict[str, Any]:
        client = str(HERE / "_jobs_client.py")
        with tempfile.TemporaryDirectory(prefix="start-bench-") as folder:
            try:
                # _jobs_client takes the wall-clock time just before its start
                return self.run([client, "run", repr(time.time()), *words], cwd=folder)
            finally:
                if "local" not in words:
                    self.run([client, "kill"], cwd=folder)

    def fresh_job(self) -> dict[str, float]:
        doc = self._job()
        return {
            "jobs_fresh_from_state_s": doc["from_state"],
            "jobs_fresh_from_process_start_s": doc["from_process_start"],
        }

    def fresh_job_torch(self) -> dict[str, float]:
        return {"jobs_fresh_torch_s": self._job("torch")["from_state"]}

    def local_job_torch(self) -> dict[str, float]:
        return {"local_job_torch_s": self._job("local", "torch")["from_state"]}


def implementations(args: argparse.Namespace, pycache: str) -> list[Impl]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("MONARCH_JOB_SECRET", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    impls = [Impl("monarch", sys.executable, env)]
    if args.baseline:
        sources = sorted(str(p) for p in Path(args.baseline).glob("packages/*/src"))
        if not sources:
            raise SystemExit(f"--baseline {args.baseline}: no packages/*/src there")
        path = os.pathsep.join([*sources, *filter(None, [env.get("PYTHONPATH")])])
        impls.append(Impl("baseline", sys.executable, {**env, "PYTHONPATH": path}))
    upstream = Path(args.upstream_python)
    if upstream.exists() and not args.no_upstream:
        impls.append(Impl("upstream", str(upstream), env))
    return impls


def _commit(checkout: str) -> str | None:
    """The commit a checkout is at (with ``+`` when it has changes), if it is one."""
    try:
        head = subprocess.run(
            ["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", checkout, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return None
    return (head + ("+" if dirty else "")) or None


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=8, help="timed repetitions (after one)")
    parser.add_argument("--baseline", metavar="DIR", help="a checkout to compare with")
    parser.add_argument("--upstream-python", default=str(UPSTREAM))
    parser.add_argument("--no-upstream", action="store_true")
    parser.add_argument(
        "--workloads",
        default="cold_start,fresh_job,cold_start_torch,cold_start_torch4,tensor_start,"
        "tensor_start_after_work,local_job_torch,fresh_job_torch",
    )
    parser.add_argument("--out", default=str(RESULTS_DIR / "start.json"))
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    samples: dict[tuple[str, str], list[float]] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="start-bench-pycache-") as pycache:
        impls = implementations(args, pycache)
        for rep in range(args.reps + 1):
            shift = rep % len(impls)
            for workload in workloads:
                for impl in impls[shift:] + impls[:shift]:
                    if impl.name in errors:
                        continue
                    try:
                        figures = getattr(impl, workload)()
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        errors[impl.name] = str(exc)
                        continue
                    if rep:
                        for name, value in figures.items():
                            samples.setdefault((name, impl.name), []).append(value)
                    shown = {k: round(v, 4) for k, v in figures.items()}
                    print(f"rep {rep} {impl.name}: {shown}", file=sys.stderr, flush=True)
    names = [impl.name for impl in impls]
    figures = [
        {"name": name, "impl": who, "label": label, "unit": "s", **summarize(values)}
        for name, label in FIGURES.items()
        for who in names
        if (values := samples.get((name, who)))
    ]
    medians = {(f["name"], f["impl"]): f["median"] for f in figures}
    targets = [
        ratio_entry(
            name,
            target,
            medians.get((name, who)),
            medians.get((name, "upstream")),
            higher_is_better=False,
            impl=who,
        )
        for name, target in TARGETS.items()
        for who in names
        if who != "upstream"
    ]
    doc = {
        "benchmark": "start",
        "machine": machine_info(),
        "settings": {
            "reps": args.reps,
            "impls": names,
            "baseline": args.baseline,
            "baseline_commit": args.baseline and _commit(args.baseline),
            "commit": _commit(str(HERE.parent)),
            "workloads": workloads,
        },
        "figures": figures,
        "targets": targets,
        "errors": errors,
    }
    out = write_json(args.out, doc)
    rows = []
    for name, label in FIGURES.items():
        if not any((name, who) in medians for who in names):
            continue  # a workload not run
        row: list[str] = [label]
        for who in names:
            fig = next((f for f in figures if f["name"] == name and f["impl"] == who), None)
            row.append(f"{fmt_num(fig['median'])} ±{fig['spread']:.0%}" if fig else "-")
        for who in ("monarch", "baseline"):
            ours, theirs = medians.get((name, who)), medians.get((name, "upstream"))
            if who in names and "upstream" in names:
                row.append(fmt_num(ours / theirs) if ours and theirs else "-")
        if "baseline" in names:
            ours, before = medians.get((name, "monarch")), medians.get((name, "baseline"))
            row.append(fmt_num(ours / before) if ours and before else "-")
        rows.append(row)
    headers = ["figure (s, median ± half range)", *names]
    headers += [
        f"{i}/upstream" for i in ("monarch", "baseline") if i in names and "upstream" in names
    ]
    if "baseline" in names:
        headers.append("monarch/baseline")
    print(markdown_table(headers, rows))
    for name, error in errors.items():
        print(f"{name}: failed: {error}")
    print(f"JSON written to {out}")


if __name__ == "__main__":
    main()
