"""Telemetry's cost per call: round trip and pipelined calls to one proc, without and with
monarch-telemetry, alternated in one run.

Run with ``hatch run bench:telemetry [--reps N] [--calls N] [--absent PYTHON] [--before DIR]
[--after DIR] [--versus DIR] [--in-process REPS] [--out PATH]``. Modes, each measured in
fresh processes (``_telemetry_client.py``), alternated:

- ``absent`` (with ``--absent PYTHON``, e.g. hatch's ``pkg-core`` environment: the same
  checkout's transport and core, monarch-telemetry not installed): the baseline;
- ``off``: installed, not used (everything of it off: the core's hooks are one test per
  call);
- ``api``: the defaults: used (``from monarch.actor import span`` does this), no exporter
  configured, no tables (spans are OpenTelemetry's non-recording ones);
- ``tables``: ``enable_telemetry()`` (the job's SQL tables: a row per message and its
  spans, for ``monarch query``, ``monarch trace``), no exporter;
- ``otlp``: imported with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: the client and the proc record
  every span and metric and export them over OTLP/HTTP to a receiver run here, which reads
  and drops them.

- ``versus-api``, ``versus-tables``, ``versus-otlp`` (with ``--versus DIR``): those modes
  with another checkout's ``packages/*/src`` first on ``PYTHONPATH``: telemetry before and
  after a change of it, alternated in one run.
- with ``--in-process REPS``: ``api`` and ``tables`` against telemetry off in one client
  (``_telemetry_ab_client.py``: a proc spawned before telemetry is used and one after,
  the client's hooks switched with them, measured in turn): both sides share the
  process, the moment and the machine's load (``in_process`` in the JSON).
- ``before`` and ``after`` (with ``--before DIR`` and ``--after DIR``): ``off`` with another
  checkout's ``packages/*/src`` first on ``PYTHONPATH`` (procs inherit it), e.g. worktrees of
  the commit that added the core's telemetry hooks and of its parent: the core's own figures
  with telemetry off, before and after a change, in one run.

Figures: the median round trip and pipelined calls/s of each mode and their ratio to
``absent`` (else ``off``; ``after`` to ``before``) measured in the same run, and the CPU
time a pipelined call costs the client and the proc (``client_cpu_us``, ``proc_cpu_us``:
each process's CPU over the burst, per call), which the load of other processes moves
less than wall-clock figures. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import RESULTS_DIR, fmt_num, machine_info, markdown_table, summarize, write_json

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "_telemetry_client.py"
PYCACHE = tempfile.mkdtemp(prefix="telemetry-bench-pycache-")


class _Drop(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def sources(checkout: str) -> str:
    """``PYTHONPATH`` putting a checkout's packages before the installed ones."""
    found = sorted(str(p) for p in Path(checkout).glob("packages/*/src"))
    if not found:
        raise SystemExit(f"{checkout}: no packages/*/src there")
    return os.pathsep.join(found)


def commit(checkout: str) -> str:
    """The commit a checkout is at (with ``+`` when it has changes)."""
    git = ["git", "-C", checkout]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def run(
    mode: str, calls: int, endpoint: str, path: str = "", python: str = sys.executable
) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    if kind(mode) == "otlp":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    client_mode = {"api": "on", "otlp": "on", "tables": "tables"}.get(kind(mode), "off")
    argv = [python, str(CLIENT), client_mode, str(calls)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    if done.returncode != 0 and not (lines and lines[-1].startswith("{")):
        raise RuntimeError(f"{mode}: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(lines[-1])
    if done.returncode != 0:  # measured, then failed as it ended: counted, not hidden
        print(f"{mode}: exited {done.returncode} after measuring: {done.stderr[-300:]}")
        figures["exit_failures"] = 1
    return figures


IN_PROCESS: Final = ("api", "tables")
AB_CLIENT: Final = HERE / "_telemetry_ab_client.py"
FIGURES: Final = ("rt_us", "pipelined_per_s", "client_cpu_us", "proc_cpu_us")


def in_process_ab(mode: str, reps: int, calls: int) -> dict[str, Any]:
    """``mode`` against telemetry off in one client (``_telemetry_ab_client.py``): each
    figure's median per side and the ratio of ``mode``'s to off's."""
    if not reps:
        return {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    argv = [sys.executable, str(AB_CLIENT), mode, str(reps), str(calls)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    lines = done.stdout.splitlines()
    if not (lines and lines[-1].startswith("{")):
        raise RuntimeError(f"in-process {mode}: {done.stderr[-2000:]}")
    sides = json.loads(lines[-1])
    figures: dict[str, Any] = {
        side: {name: summarize([r[name] for r in runs]) for name in FIGURES}
        for side, runs in sides.items()
    }
    on, off = figures[mode], figures["off"]
    figures["ratio"] = {name: on[name]["median"] / off[name]["median"] for name in FIGURES}
    cpu = ("client_cpu_us", "proc_cpu_us")
    on_cpu, off_cpu = (sum(side[n]["median"] for n in cpu) for side in (on, off))
    figures["ratio"]["cpu"] = on_cpu / off_cpu
    figures["added_cpu_us_per_call"] = on_cpu - off_cpu
    return figures


def kind(mode: str) -> str:
    """What a mode measures: ``versus-api`` is ``api`` on the ``--versus`` checkout."""
    return mode.removeprefix(VERSUS)


VERSUS = "versus-"


def paired_range(ratios: dict[str, Any]) -> str:
    return f"{ratios['min']:.3f}..{ratios['max']:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument(
        "--absent", metavar="PYTHON", help="a Python without monarch-telemetry: 'absent' mode"
    )
    parser.add_argument("--before", metavar="DIR", help="a checkout: the 'before' mode's core")
    parser.add_argument("--after", metavar="DIR", help="a checkout: the 'after' mode's core")
    parser.add_argument(
        "--versus",
        metavar="DIR",
        help="a checkout: its api, tables and otlp modes too (versus-api, ...), e.g. the "
        "telemetry before a change, in the same run",
    )
    parser.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="REPS",
        help="also the in-process A/B of api and tables (_telemetry_ab_client.py), REPS "
        "alternations each",
    )
    parser.add_argument("--out", default=str(RESULTS_DIR / "telemetry.json"))
    args = parser.parse_args()
    paths = {"before": args.before, "after": args.after}
    paths = {mode: sources(checkout) for mode, checkout in paths.items() if checkout}
    versus = [f"{VERSUS}{mode}" for mode in ("api", "tables", "otlp")] if args.versus else []
    paths |= {mode: sources(args.versus) for mode in versus}

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Drop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    absent = ["absent"] if args.absent else []
    modes = [*paths, *absent, "off", "api", "tables", "otlp"]  # versus-X: among the paths
    modes = modes if args.reps else []  # --reps 0: the in-process A/B alone
    pythons = {"absent": args.absent} if args.absent else {}

    def measure(mode: str, calls: int) -> dict[str, float]:
        return run(mode, calls, endpoint, paths.get(mode, ""), pythons.get(mode, sys.executable))

    for mode in modes:  # untimed: fills the bytecode cache
        measure(mode, 200)
    reps: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for i in range(args.reps):
        for mode in modes if i % 2 == 0 else modes[::-1]:  # alternated, both orders
            reps[mode].append(measure(mode, args.calls))
    server.shutdown()
    in_process = {mode: in_process_ab(mode, args.in_process, args.calls) for mode in IN_PROCESS}

    figures: dict[str, Any] = {}
    for mode in modes:
        figures[mode] = {
            name: summarize([r[name] for r in reps[mode] if name in r]) for name in FIGURES
        }
    for mode in modes:
        figures[mode]["exit_failures"] = sum(r.get("exit_failures", 0) for r in reps[mode])
    rows = []
    base = "absent" if "absent" in figures else "off"
    if not figures:  # nothing measured in separate processes
        base = "-"
    for mode in modes:
        # "after" against "before"; the others against "absent" (else "off")
        off = figures["before" if mode == "after" and "before" in figures else base]
        rt = figures[mode]["rt_us"]["median"]
        rate = figures[mode]["pipelined_per_s"]["median"]
        figures[mode]["rt_ratio_to_off"] = rt / off["rt_us"]["median"]
        figures[mode]["rate_ratio_to_off"] = rate / off["pipelined_per_s"]["median"]
        figures[mode]["added_us_per_call"] = rt - off["rt_us"]["median"]
        # each rep against its own baseline rep, run next to it: the noise of a loaded
        # machine shows as the spread of these ratios
        pairs = zip(off["rt_us"]["reps"], figures[mode]["rt_us"]["reps"], strict=True)
        figures[mode]["rt_paired_ratio"] = summarize([m / b for b, m in pairs])
        cpu = [figures[mode][side]["median"] for side in ("client_cpu_us", "proc_cpu_us")]
        base_cpu = [off[side]["median"] for side in ("client_cpu_us", "proc_cpu_us")]
        if None not in cpu and None not in base_cpu:  # both sides' CPU, against the baseline
            figures[mode]["cpu_ratio_to_off"] = sum(cpu) / sum(base_cpu)
        rows.append(
            [
                mode,
                fmt_num(rt),
                fmt_num(figures[mode]["rt_ratio_to_off"]),
                paired_range(figures[mode]["rt_paired_ratio"]),
                fmt_num(rate),
                fmt_num(figures[mode]["rate_ratio_to_off"]),
                fmt_num(figures[mode]["client_cpu_us"]["median"]),
                fmt_num(figures[mode]["proc_cpu_us"]["median"]),
                fmt_num(figures[mode].get("cpu_ratio_to_off")),
            ]
        )
    doc = {
        "benchmark": "telemetry",
        "machine": machine_info(),
        "settings": {"reps": args.reps, "calls": args.calls, "baseline": base},
        "commit": commit(str(HERE.parent)),
        "checkouts": {
            mode: {"dir": checkout, "commit": commit(checkout)}
            for mode, checkout in (
                ("before", args.before),
                ("after", args.after),
                ("versus", args.versus),
            )
            if checkout
        },
        "figures": figures,
        "in_process": in_process if args.in_process else {},
    }
    path = write_json(args.out, doc)
    headers = ["mode", "round trip (us)", f"x {base}", "rep/rep range", "pipelined calls/s"]
    headers += [f"x {base}", "client CPU us/call", "proc CPU us/call", f"CPU x {base}"]
    print(markdown_table(headers, rows))
    if "after" in figures and "before" in figures:
        print("(after: x before)")
    for mode, ab in in_process.items():
        if ab:
            ratios = ", ".join(f"{name} x{value:.3f}" for name, value in ab["ratio"].items())
            print(f"in-process {mode} against off: {ratios}")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
