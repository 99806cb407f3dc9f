"""The controller's footprint over many namespace hosts (issue 34): connections and
messages bounded by hosts and fan-out, not procs; A/B against another checkout.

Run with ``hatch run bench:hosts-footprint [--hosts 32] [--per-host 8] [--base DIR]`` as root.
The job is ``packages/monarch-core/tests/many_hosts.py``'s (TLS workers with the job secret,
the controller on a host of its own), without faults: ``many_hosts.footprint`` measures,
after attach and spawn, the controller's TCP connections by state (``ss``) and by its own
books (outbound, inbound), packets, bytes and messages per second idle and with casts
flowing (a ``tick`` broadcast and a gathered ``echo`` every 50 ms), messages per gathered
call, and the latency of a round trip to one actor and of a gathered call to all (median
of ``--reps``). With ``--base DIR`` (a checkout, e.g. ``git archive main``), each round
runs that checkout's packages (on ``PYTHONPATH``, for the workers, procs and controller)
then this one's, alternated ``--rounds`` times: A/B in the same run. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "packages" / "monarch-core" / "tests"))  # the scenario

import many_hosts  # type: ignore[import-not-found]  # noqa: E402
from _hosts_cli import add_beat_args, beats_env  # noqa: E402
from _results import RESULTS_DIR, machine_info, package_versions, write_json  # noqa: E402
from hostkit import netns_unavailable  # type: ignore[import-not-found]  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--base", type=Path, help="a checkout to run first in each round (A)")
    add_beat_args(parser)
    parser.add_argument("--max-cast-fanout", default="", help="max_cast_fanout ('' = default)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "ctl34_footprint.json")
    return parser.parse_args(argv)


def source_path(checkout: Path) -> str:
    """``PYTHONPATH`` that makes ``checkout``'s packages the ones imported."""
    return ":".join(str(p) for p in sorted((checkout / "packages").glob("*/src")))


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """The figures compared, from one run."""
    if "failed" in run:
        return {"failed": run["failed"][-300:]}
    lat = run["latency"]
    return {
        "connections_idle": run["idle"]["connections"],
        "busy_connections_idle": run["idle"]["busy_connections"],
        "states_idle": run["idle"]["states"],
        "books_idle": {k: run["idle"]["books"][k] for k in ("outbound", "inbound", "dialed")},
        "rx_pps_idle": round(run["idle"]["rx_pps"], 1),
        "bytes_ps_idle": round(run["idle"]["bytes_ps"]),
        "messages_ps_idle": round(run["idle"]["sent_ps"] + run["idle"]["received_ps"], 1),
        "connections_flowing": run["flowing"]["connections"],
        "rx_pps_flowing": round(run["flowing"]["rx_pps"], 1),
        "messages_ps_flowing": round(run["flowing"]["sent_ps"] + run["flowing"]["received_ps"], 1),
        "sent_per_cast": lat["sent_per_cast"],
        "received_per_cast": lat["received_per_cast"],
        "one_ms_median": round(statistics.median(lat["one_ms"]), 3),
        "first_call_ms_median": round(statistics.median(lat["first_call_ms"]), 3),
        "cast_ms_median": round(statistics.median(lat["cast_ms"]), 3),
        "spawn_s": round(run["spawn_s"], 2),
        "stop_s": round(run["stop"].get("stop_s", -1), 2),
        "left_after": run["left_after"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = netns_unavailable()
    if reason is not None:
        print(f"skipped: {reason}", file=sys.stderr)
        return 2
    env = beats_env(args)
    if args.max_cast_fanout:
        env["HYPERACTOR_MESH_MAX_CAST_FANOUT"] = args.max_cast_fanout
    sides = [("base", args.base), ("this", None)] if args.base else [("this", None)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in sides}
    for round_ in range(args.rounds):
        for name, checkout in sides:
            side_env = dict(env)
            if checkout is not None:
                side_env["PYTHONPATH"] = source_path(checkout)
            print(f"round {round_}: {name}, {args.hosts} x {args.per_host}", file=sys.stderr)
            started = time.monotonic()
            try:
                with many_hosts.cluster(args.hosts, args.per_host, side_env) as c:
                    run = many_hosts.footprint(c, reps=args.reps, idle_s=args.idle_s)
            except AssertionError as exc:  # the run failed: what it said is the finding
                run = {"failed": str(exc)[-6000:]}
            run["total_s"] = time.monotonic() - started
            runs[name].append(run)
            print(json.dumps(summary(run), indent=1), file=sys.stderr, flush=True)
    doc = {
        "benchmark": "hosts-footprint",
        "issue": 34,
        "hosts": args.hosts,
        "per_host": args.per_host,
        "settings": env,
        "base": str(args.base) if args.base else None,
        "machine": machine_info(),
        "versions": package_versions(["monarch-core", "monarch-transport"]),
        "summary": {name: [summary(run) for run in side] for name, side in runs.items()},
        "runs": runs,
    }
    print(write_json(args.out, doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
