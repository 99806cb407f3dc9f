"""Shared output helpers for the benchmarks: machine info, summaries, JSON and markdown.

Every benchmark writes one JSON document (``machine``, its settings, every figure with
all its repetitions) and prints markdown tables; these helpers keep that uniform.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """What the figures depend on: the machine, its load, the interpreter."""
    info: dict[str, Any] = {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def summarize(reps: Sequence[float]) -> dict[str, Any]:
    """Median and spread of repetitions (the median is the headline figure)."""
    if not reps:
        return {"reps": [], "median": None, "min": None, "max": None, "spread": None}
    med = statistics.median(reps)
    return {
        "reps": [float(r) for r in reps],
        "median": float(med),
        "min": float(min(reps)),
        "max": float(max(reps)),
        # relative half-range: a quick noise indicator
        "spread": float((max(reps) - min(reps)) / (2 * med)) if med else None,
    }


def figures_of(
    runs: Sequence[dict[str, Any]],
    groups: Sequence[tuple[str, int]],
    table: dict[str, tuple[str, str]],
) -> list[dict[str, Any]]:
    """One figure per (side, procs) group and per key of ``table`` (its unit and label)
    that the group's runs measured: their values, summarized."""
    figures = []
    for side, procs in groups:
        done = [r for r in runs if r["side"] == side and r["procs"] == procs]
        for key, (unit, label) in table.items():
            reps = [r[key] for r in done if r.get(key) is not None]
            if reps:
                figures.append(
                    {"side": side, "procs": procs, "name": key, "unit": unit}
                    | {"label": label, **summarize(reps)}
                )
    return figures


def memcpy_bandwidth(size: int, reps: int) -> dict[str, Any]:
    """An in-process copy of ``size`` bytes (a bytearray into another), in MiB/s: the
    baseline that large transfers are compared with (one untimed warm-up copy)."""
    src = bytearray(os.urandom(1024)) * (size // 1024)
    dst = bytearray(size)
    figures = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        dst[:] = src
        figures.append(size / (1024 * 1024) / (time.perf_counter() - t0))
    return {"unit": "MiB/s", "size": size, **summarize(figures[1:])}


def percentile(samples: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of a non-empty sample."""
    ordered = sorted(samples)
    return float(ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))])


def ratio_entry(
    name: str,
    target: float,
    ours: float | None,
    baseline: float | None,
    *,
    higher_is_better: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """``ours / baseline`` against a target: ``ratio >= target``, or ``<=`` for costs."""
    ratio = ours / baseline if ours is not None and baseline else None
    passed = None if ratio is None else (ratio >= target if higher_is_better else ratio <= target)
    return {
        "name": name,
        **extra,
        "op": ">=" if higher_is_better else "<=",
        "target": target,
        "ours": ours,
        "baseline": baseline,
        "ratio": ratio,
        "pass": passed,
    }


def run_workload(
    python: str, script: Path, argv: Sequence[str], env: dict[str, str], timeout: float
) -> dict[str, Any]:
    """Run ``script`` (a workload that writes its figures to ``--json FILE``) under
    ``python`` in a fresh process; its figures, or ``{"error": ...}`` with why not."""
    with tempfile.TemporaryDirectory(prefix=f"{script.stem}-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [python, str(script), *argv, "--json", str(out)]
        try:
            proc = subprocess.run(
                cmd, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        if not out.exists():
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-5:]
            return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
        doc: dict[str, Any] = json.loads(out.read_text())
        return doc


def write_json(path: str | os.PathLike[str], doc: dict[str, Any]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    tmp.replace(out)
    return out


def fmt_num(value: float | None, digits: int = 3) -> str:
    """Human-friendly number: 3 significant digits, thousands separators."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    mag = abs(value)
    if mag >= 10**digits:
        return f"{value:,.0f}"
    # significant digits below 1000
    decimals = max(0, digits - 1 - math.floor(math.log10(mag)))
    return f"{value:,.{decimals}f}"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    rows = [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(list(headers)), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def print_report(
    figures: dict[str, dict[str, Any]],
    targets: Sequence[dict[str, Any]],
    notes: Sequence[str],
    errors: Any,
    path: Path,
) -> None:
    """Print a benchmark's figures (median, unit, spread, ms per op) and its targets
    (``ratio_entry`` rows) as markdown, then its notes and errors, and where it wrote them."""
    rows = []
    for key, fig in figures.items():
        spread = fig.get("spread")
        per_op = f"{fmt_num(fig['ms_per_op'])} ms/op" if "ms_per_op" in fig else ""
        rows.append(
            [
                key,
                fmt_num(fig.get("median")),
                fig.get("unit"),
                "-" if spread is None else f"±{spread:.0%}",
                per_op,
            ]
        )
    print(markdown_table(["figure", "median", "unit", "spread", ""], rows))
    print()
    print(
        markdown_table(
            ["target", "ours", "baseline", "ratio", "want", "pass"],
            [
                [
                    t["name"],
                    fmt_num(t.get("ours")),
                    fmt_num(t.get("baseline")),
                    fmt_num(t.get("ratio")),
                    f"{t['op']} {t['target']}",
                    t["pass"],
                ]
                for t in targets
            ],
        )
    )
    for note in notes:
        print(f"note: {note}")
    if errors:
        print(f"errors: {json.dumps(errors)[:2000]}")
    print(f"wrote {path}")


def cpu_seconds(pids: Iterable[int]) -> float:
    """The CPU that the running ones of ``pids`` have used, every thread, to the nanosecond
    (the scheduler's ``schedstat``: the ticks of ``/proc/PID/stat`` miss most of a
    process that runs in bursts of microseconds after its CPU was idle)."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def write_result(path: str, work: Callable[[], dict[str, Any]]) -> int:
    """Run ``work`` and write what it measured, or the error that stopped it, to ``path``
    as one JSON line with the Python and whether this client imported torch (what
    ``scale_bench`` reads back from each workload)."""
    doc: dict[str, Any] = {"python": sys.version.split()[0], "torch": "torch" in sys.modules}
    try:
        doc.update(work())
    except Exception as exc:  # noqa: BLE001 - reported to scale_bench
        doc["error"] = repr(exc)
    Path(path).write_text(json.dumps(doc) + "\n")
    return 0
