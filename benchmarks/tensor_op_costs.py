"""Where a small tensor-engine operation's time goes: each case beside its floor, a plain
actor call returning a 4x4 tensor, alternated in one process on a mesh of 2 procs.

    python benchmarks/tensor_op_costs.py [--rounds N] [--calls N] [--pids]

Cases: the plain call (the core's round trip), ``fetch_shard`` of a 4x4 shard, a
``remote`` function and its fetch, ``t + 1`` and its fetch. Prints, per round and case,
the medians (ms) of ``--calls`` timings, three times. Run it with another checkout's
sources first on ``PYTHONPATH`` for a before/after (issue 29: monarch-tensor's README,
"Speed"). ``--pids`` prints the client's and the procs' pids and loops on the remote case
for 30 s, for ``py-spy record -p PID``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _tensor_fns import add_one

import monarch
from monarch.actor import Actor, endpoint, this_host


class Plain(Actor):
    """The floor: an actor call returning what a fetch returns."""

    @endpoint
    def get(self) -> torch.Tensor:
        return torch.ones(4, 4)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def medians(fn: Callable[[], Any], calls: int) -> list[float]:
    out = []
    for _ in range(3):
        samples = []
        for _ in range(calls):
            begun = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - begun)
        out.append(1000 * statistics.median(samples))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--pids", action="store_true")
    args = p.parse_args()
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    procs.initialized.get()
    plain = procs.spawn("plain", Plain)
    one = plain.slice(gpus=1)
    remote_add = monarch.remote(add_one, propagate=lambda t: t.clone())
    with procs.activate():
        small = torch.ones(4, 4)
    monarch.fetch_shard(small).get()

    def remote_fetch() -> Any:
        with procs.activate():
            return monarch.fetch_shard(remote_add(small), gpus=1).get()

    def op_fetch() -> Any:
        with procs.activate():
            return monarch.fetch_shard(small + 1, gpus=1).get()

    cases: dict[str, Callable[[], Any]] = {
        "plain_call": lambda: one.get.call_one().get(),
        "fetch": lambda: monarch.fetch_shard(small, gpus=1).get(),
        "remote_fetch": remote_fetch,
        "op_fetch": op_fetch,
    }
    for fn in cases.values():  # warm-up: the first use of each path
        for _ in range(20):
            fn()
    if args.pids:
        print("client", os.getpid(), "procs", list(plain.pid.call().get().values()), flush=True)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            remote_fetch()
    else:
        for _ in range(args.rounds):
            for name, fn in cases.items():
                print(name, " ".join(f"{ms:.3f}" for ms in medians(fn, args.calls)), flush=True)
    procs.stop().get()


if __name__ == "__main__":
    main()
