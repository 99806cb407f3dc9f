"""Many hosts: 256 procs over 32 namespace hosts, with faults (issue 34, "Many hosts").

Run with ``hatch run bench:hosts [--hosts 32] [--per-host 8] [--out PATH]`` as root (network
namespaces, iptables). One ``monarch worker`` per host (TLS from ``monarch tls``, the job
secret in a 0600 file), the controller on a host of its own; the scenario is
``packages/monarch-core/tests/many_hosts.py``'s (the one test_many_hosts.py checks at 8
hosts): attach, spawn, gathered calls, the controller's connections and packets per
second (idle and with casts flowing), a host SIGKILLed during a call (the pending call, the
client's fault hook and the owning actor's ``__supervise__``, each after the fault), a host
partitioned by iptables DROP during a call, fencing (a frozen proc, a frozen worker, the
partition healed: the host's procs gone, no tick run after the job wrote them off), and
``stop()`` with the processes left. Heartbeats at the library's defaults, 1 s / 5 s
(``--heartbeat-interval``, ``--heartbeat-timeout``). A run that fails is recorded with what
it said. Upstream 0.7.0 has no
``monarch worker`` with TLS and a secret file to run beside it here, so there is no baseline
run; the same-run reference is the controller's figures at ``--small`` hosts (8), measured
first (8 hosts x 8 procs). Nothing here asserts on speed.
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("--small", type=int, default=8, help="hosts of the reference run (0: none)")
    parser.add_argument("--small-per-host", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    add_beat_args(parser)
    parser.add_argument(
        "--handshake-timeout", default="10s", help="transport_handshake_timeout (the default)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "hosts34_32hosts.json")
    return parser.parse_args(argv)


def run(hosts: int, per_host: int, reps: int, beats: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    with many_hosts.cluster(hosts, per_host, beats) as c:
        result: dict[str, Any] = many_hosts.scenario(c, reps=reps)
    result["total_s"] = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = netns_unavailable()
    if reason is not None:
        print(f"skipped: {reason}", file=sys.stderr)
        return 2
    runs: dict[str, Any] = {}
    beats = {**beats_env(args), "MONARCH_TRANSPORT_HANDSHAKE_TIMEOUT": args.handshake_timeout}
    sizes = [(args.small, args.small_per_host)] if args.small else []
    for hosts, per_host in [*sizes, (args.hosts, args.per_host)]:
        print(f"{hosts} hosts x {per_host} procs ...", file=sys.stderr, flush=True)
        try:
            result = run(hosts, per_host, args.reps, beats)
        except AssertionError as exc:  # the run failed: what it said is the finding
            result = {"hosts": hosts, "per_host": per_host, "failed": str(exc)[-6000:]}
        runs[f"{hosts}x{per_host}"] = result
        print(json.dumps(result, indent=1), file=sys.stderr, flush=True)
    doc = {
        "benchmark": "hosts",
        "issue": 34,
        "settings": beats,
        "machine": machine_info(),
        "versions": package_versions(["monarch-core", "monarch-transport"]),
        "runs": runs,
    }
    print(write_json(args.out, doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
