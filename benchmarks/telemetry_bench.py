"""Telemetry's cost per call: round trip and pipelined calls to one proc, without and with
monarch-telemetry, alternated in one run.

Run with ``hatch run bench:telemetry [--reps N] [--calls N] [--before DIR] [--after DIR]
[--out PATH]``. Modes, each measured in fresh processes (``_telemetry_client.py``):

- ``off``: monarch.telemetry not imported (the core's hooks are one test per call);
- ``api``: imported, no exporter configured (spans are OpenTelemetry's non-recording ones);
- ``otlp``: imported with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: the client and the proc record
  every span and metric and export them over OTLP/HTTP to a receiver run here, which reads
  and drops them.

- ``before`` and ``after`` (with ``--before DIR`` and ``--after DIR``): ``off`` with another
  checkout's ``packages/*/src`` first on ``PYTHONPATH`` (procs inherit it), e.g. worktrees of
  the commit that added the core's telemetry hooks and of its parent: the core's own figures
  with telemetry off, before and after a change, in one run.

Figures: the median round trip and pipelined calls/s of each mode and their ratio to
``off`` (``after`` to ``before``) measured in the same run. Nothing is asserted.
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
from typing import Any

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


def run(mode: str, calls: int, endpoint: str, path: str = "") -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    if mode == "otlp":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    on = mode in ("api", "otlp")
    argv = [sys.executable, str(CLIENT), "on" if on else "off", str(calls)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--before", metavar="DIR", help="a checkout: the 'before' mode's core")
    parser.add_argument("--after", metavar="DIR", help="a checkout: the 'after' mode's core")
    parser.add_argument("--out", default=str(RESULTS_DIR / "telemetry.json"))
    args = parser.parse_args()
    paths = {"before": args.before, "after": args.after}
    paths = {mode: sources(checkout) for mode, checkout in paths.items() if checkout}

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Drop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    modes = [*paths, "off", "api", "otlp"]
    for mode in modes:  # untimed: fills the bytecode cache
        run(mode, 200, endpoint, paths.get(mode, ""))
    reps: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for _ in range(args.reps):
        for mode in modes:
            reps[mode].append(run(mode, args.calls, endpoint, paths.get(mode, "")))
    server.shutdown()

    figures: dict[str, Any] = {}
    for mode in modes:
        figures[mode] = {
            "rt_us": summarize([r["rt_us"] for r in reps[mode]]),
            "pipelined_per_s": summarize([r["pipelined_per_s"] for r in reps[mode]]),
        }
    rows = []
    for mode in modes:
        # "after" against "before"; the others against "off"
        off = figures["before" if mode == "after" and "before" in figures else "off"]
        rt = figures[mode]["rt_us"]["median"]
        rate = figures[mode]["pipelined_per_s"]["median"]
        figures[mode]["rt_ratio_to_off"] = rt / off["rt_us"]["median"]
        figures[mode]["rate_ratio_to_off"] = rate / off["pipelined_per_s"]["median"]
        figures[mode]["added_us_per_call"] = rt - off["rt_us"]["median"]
        rows.append(
            [
                mode,
                fmt_num(rt),
                fmt_num(figures[mode]["rt_ratio_to_off"]),
                fmt_num(rate),
                fmt_num(figures[mode]["rate_ratio_to_off"]),
            ]
        )
    doc = {
        "benchmark": "telemetry",
        "machine": machine_info(),
        "settings": {"reps": args.reps, "calls": args.calls},
        "commit": commit(str(HERE.parent)),
        "checkouts": {
            mode: {"dir": getattr(args, mode), "commit": commit(getattr(args, mode))}
            for mode in paths
        },
        "figures": figures,
    }
    path = write_json(args.out, doc)
    headers = ["mode", "round trip (us)", "x off", "pipelined calls/s", "x off"]
    print(markdown_table(headers, rows))
    if "after" in figures and "before" in figures:
        print("(after: x before)")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
