"""What the many-hosts benchmarks share (``hosts_bench``, ``hosts_footprint_bench``, both
running ``many_hosts``' scenario from monarch-core's tests): the heartbeat settings every
worker, proc and controller of the job gets in its environment."""

from __future__ import annotations

import argparse


def add_beat_args(parser: argparse.ArgumentParser) -> None:
    """``--heartbeat-interval`` and ``--heartbeat-timeout``, the library's defaults."""
    parser.add_argument("--heartbeat-interval", default="1s", help="the library's default")
    parser.add_argument("--heartbeat-timeout", default="5s", help="the library's default")


def beats_env(args: argparse.Namespace) -> dict[str, str]:
    """The job's environment for the heartbeat settings parsed by ``add_beat_args``."""
    return {
        "MONARCH_HEARTBEAT_INTERVAL": args.heartbeat_interval,
        "MONARCH_HEARTBEAT_TIMEOUT": args.heartbeat_timeout,
    }
