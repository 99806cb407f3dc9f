"""Jobs: a script's ProcessJob from process start to its first replies, fresh and re-attached.

Run with ``hatch run bench:jobs [--reps N] [--out PATH]``. Each repetition runs a user's
script (``_jobs_client.py``, upstream's API only) three times in a fresh folder: the first
run starts two ``ProcessJob`` hosts and saves the job; the second finds the saved job and
re-attaches to the running hosts; a third kills them. Ours and upstream 0.7.0 (when
``benchmarks/.venvs/upstream`` exists) alternate repetitions. Figures: seconds from the
process's start, and from ``state()``, to the first reply of an actor on every host.
Targets (issue 16): ours <= 0.5x upstream's, fresh and re-attached. Nothing is asserted.

Then (as root, with Slurm installed: tools/system-packages.sh) the same script with a
``SlurmJob`` of 2 nodes on a real Slurm in network-namespace hosts (tools/netns/hosts.sh,
tools/slurm/start-netns.sh: slurmctld and the client in h1, a slurmd in h2 and h3), each
repetition a fresh allocation, cancelled after: seconds from the allocation's grant (the
time its batch script started), from ``state()`` (sbatch) and from process start to the
first reply of an actor on each node. Ours only: upstream's workers advertise the host
name, one for every namespace here, and its client dials the Slurm node names, which no
resolver here maps to the namespaces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
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
TOOLS = HERE.parent / "tools"
SLURM_FIGURES = [
    ("from_allocation", "SlurmJob, 2 nodes: allocation granted to first replies"),
    ("workers_listening", "SlurmJob, 2 nodes: allocation granted to both workers listening"),
    ("from_state", "SlurmJob, 2 nodes: state() (sbatch) to first replies"),
    ("from_process_start", "SlurmJob, 2 nodes: process start to first replies"),
]


def one(
    python: str,
    folder: Path,
    *args: str,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    done = subprocess.run(
        [*prefix, python, str(CLIENT), *args],
        cwd=folder,
        env=env or ENV,
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


def slurm_unavailable() -> str | None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2 (network namespaces)"
    if shutil.which("slurmctld") is None or shutil.which("slurmd") is None:
        return "no Slurm here (tools/system-packages.sh installs it)"
    return None


def check(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


@contextlib.contextmanager
def slurm_cluster(folder: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """h1 (slurmctld, the client) and a slurmd in each of h2, h3: the client's command
    prefix and environment. Removed on exit, with whatever still runs there."""
    prefix = f"jb{os.getpid() % 100000}"
    hosts_sh = str(TOOLS / "netns" / "hosts.sh")
    try:
        hosts = check(["bash", hosts_sh, "up", prefix, "3"]).split()
        check(["bash", str(TOOLS / "slurm" / "start-netns.sh"), str(folder), *hosts])
        env = {**ENV, "SLURM_CONF": str(folder / "slurm.conf")}
        yield ["ip", "netns", "exec", hosts[0]], env
    finally:
        subprocess.run(["bash", hosts_sh, "down", prefix], capture_output=True)


def slurm_repetition(prefix: list[str], env: dict[str, str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="jobs-bench-slurm-") as folder:
        path = Path(folder)
        try:
            return one(
                sys.executable,
                path,
                "slurm",
                repr(time.time()),
                str(path / "logs"),
                prefix=prefix,
                env=env,
            )
        finally:
            one(sys.executable, path, "kill", prefix=prefix, env=env)
            deadline = time.monotonic() + 60  # the next repetition gets idle nodes
            while check([*prefix, "squeue", "-h"], env).strip():
                if time.monotonic() > deadline:
                    raise RuntimeError("the Slurm job was not gone within 60 s")
                time.sleep(0.05)


def slurm_figures(reps: int, errors: dict[str, str]) -> list[dict[str, Any]]:
    """SlurmJob with 2 nodes, ``reps`` timed repetitions after an untimed one."""
    why = slurm_unavailable()
    if why is not None:
        errors["slurm"] = f"skipped: {why}"
        return []
    samples: list[dict[str, float]] = []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="jobs-bench-cluster-") as folder,
            slurm_cluster(Path(folder)) as (prefix, env),
        ):
            for rep in range(reps + 1):
                result = slurm_repetition(prefix, env)
                if rep:
                    samples.append(result)
                print(f"rep {rep} slurm: {json.dumps(result)}", file=sys.stderr, flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        errors["slurm"] = str(exc)
        return []
    return [
        {
            "name": f"slurm_2_nodes_{key}",
            "impl": "monarch",
            "label": label,
            "unit": "s",
            **summarize([s[key] for s in samples]),
        }
        for key, label in SLURM_FIGURES
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS_DIR / "jobs.json"))
    parser.add_argument("--upstream-python", default=str(UPSTREAM))
    parser.add_argument("--slurm-reps", type=int, default=5, help="0: no Slurm figures")
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
    slurm = slurm_figures(args.slurm_reps, errors) if args.slurm_reps > 0 else []
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
        "settings": {
            "reps": args.reps,
            "slurm_reps": args.slurm_reps,
            "hosts": 2,
            "impls": list(impls),
            "pycache": PYCACHE,
        },
        "figures": figures + slurm,
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
    if slurm:
        rows = [[f["label"], fmt_num(f["median"]), fmt_num(f["min"])] for f in slurm]
        print(markdown_table(["figure (s)", "median", "min"], rows))
    for name, error in errors.items():
        print(f"{name}: failed: {error}")
    print(f"JSON written to {out}")


if __name__ == "__main__":
    main()
