"""``monarch trace [-o FILE]``: a live job's timeline as a Perfetto trace, on demand.

The job's client builds it from its telemetry tables (monarch-telemetry's ``spans``: each
call's send, each endpoint's run, the time between in the actor's queue); its admin server
hands it over (``/v1/trace``), found as for ``monarch top``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._client import AdminError, add_server_options, found_server

TRACE_TIMEOUT = 120.0
"""Seconds the client may take to build a long job's trace."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "trace",
        help="write a live job's timeline as a Perfetto trace (ui.perfetto.dev opens it)",
        description="Write the timeline of the job of this folder's active monarch context "
        "(its client's enable_telemetry()) as Chrome trace-event JSON: one track per proc "
        "and actor, a flow arrow from each send to the run it caused.",
    )
    parser.add_argument(
        "-o", "--output", default="monarch-trace.json", help="where (default: %(default)s)"
    )
    add_server_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client = found_server(args, "trace")
    if client is None:
        return 2
    try:
        trace = client.get("/v1/trace", timeout=TRACE_TIMEOUT)
    except AdminError as exc:
        print(f"monarch trace: {exc}", file=sys.stderr)
        return 1
    path = Path(args.output)
    path.write_text(json.dumps(trace))
    slices = sum(1 for e in trace.get("traceEvents", ()) if e.get("ph") == "X")
    print(f"{path}: {slices} slices; open it in https://ui.perfetto.dev", file=sys.stderr)
    return 0
