"""``monarch profile [--seconds N] [--rate R] [--idle] [-o PREFIX]``: sample a running job.

Its admin server (found as for ``monarch top``) has py-spy sample every live proc of the
job, the client too, at once for N seconds (``/v1/profile``; procs on other hosts sample
themselves), and with ``--torch`` the torch profiler run in every proc that uses torch;
this writes the merged
Perfetto trace (``PREFIX.json``: the samples on each proc's track, beside the job's spans
where its client keeps telemetry tables) and a flame graph of the whole job
(``PREFIX.svg``: the procs side by side).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._client import AdminError, add_server_options, found_server
from ._flamegraph import flamegraph_svg
from ._profile import MAX_SECONDS
from ._self_profile import EXTRA


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="sample every proc of a running job (py-spy): a Perfetto trace and a flame graph",
        description="Sample the Python stacks of every proc of the job of this folder's "
        "active monarch context (those on its admin server's machine) with py-spy, all at "
        "once; write PREFIX.json (a Perfetto trace, with the job's spans when its client "
        "keeps telemetry tables) and PREFIX.svg (a flame graph of the whole job).",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="how long (default 5)")
    parser.add_argument("--rate", type=int, default=100, help="samples a second (default 100)")
    parser.add_argument("--idle", action="store_true", help="sample waiting threads too")
    parser.add_argument(
        "--py-spy", action="store_true", help="sample with py-spy (the default, always on)"
    )
    parser.add_argument(
        "--torch",
        action="store_true",
        help="also run the torch profiler in every proc that uses torch (its ops on the trace)",
    )
    parser.add_argument(
        "-o", "--output", default="monarch-profile", help="the files' PREFIX (%(default)s)"
    )
    add_server_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.seconds <= MAX_SECONDS:
        print(f"monarch profile: --seconds must be in (0, {MAX_SECONDS:g}]", file=sys.stderr)
        return 2
    client = found_server(args, "profile")
    if client is None:
        return 2
    query = f"/v1/profile?seconds={args.seconds}&rate={args.rate}&idle={int(args.idle)}"
    query += "&torch=1" if args.torch else ""
    print(f"monarch profile: sampling for {args.seconds:g}s...", file=sys.stderr, flush=True)
    try:
        result = client.get(query, timeout=args.seconds + EXTRA + client.timeout)
    except AdminError as exc:
        print(f"monarch profile: {exc}", file=sys.stderr)
        return 1
    for note in result.get("notes", ()):
        print(f"monarch profile: not sampled: {note}", file=sys.stderr)
    trace = Path(f"{args.output}.json")
    trace.write_text(json.dumps({"traceEvents": result["traceEvents"], "displayTimeUnit": "ms"}))
    svg = Path(f"{args.output}.svg")
    svg.write_text(flamegraph_svg(result["stacks"], f"monarch profile: {args.seconds:g}s"))
    print(f"{trace} (open it in https://ui.perfetto.dev)\n{svg}")
    return 0 if result["stacks"] else 1
