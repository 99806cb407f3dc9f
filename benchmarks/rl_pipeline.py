"""An RL-style pipeline under a flood: how fast its steps go, and the flooded proc's memory.

Four generator actors each run a background task that sends rollouts into the scorer's
port in a tight loop (``port.send(...)`` then ``await asyncio.sleep(0)``); the scorer and
the reference pass them on through ports; the trainer takes ``--batch`` rollouts a step
and sends fresh weights to one generator (``send(..., selection="choose")``). Torch
tensors when torch is importable. Written against upstream's public API only::

    python benchmarks/rl_pipeline.py --steps 20
    benchmarks/.venvs/upstream/bin/python benchmarks/rl_pipeline.py --steps 20

Prints a JSON line per ``--every`` steps (seconds so far, the scorer's RSS) and one at
the end. Not a test: nothing is asserted; a step slower than ``--step-timeout`` ends it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import time
from typing import Any

from monarch.actor import Actor, Channel, Port, endpoint, send, this_host

HAS_TORCH = importlib.util.find_spec("torch") is not None


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def tensor(size: int) -> Any:
    if HAS_TORCH:
        import torch

        return torch.randn(size)
    return os.urandom(4 * size)


class Generator(Actor):
    def __init__(self) -> None:
        self.version = 0
        self.task: Any = None

    @endpoint
    async def start(self, scorer: Port[Any], rank: int) -> None:
        async def generate() -> None:
            while True:
                scorer.send({"generator": rank, "weights": self.version, "tokens": tensor(256)})
                await asyncio.sleep(0)

        self.task = asyncio.get_running_loop().create_task(generate())

    @endpoint
    async def update_weights(self, weights: Any, version: int) -> None:
        self.version = version

    @endpoint
    async def halt(self) -> float:
        if self.task is not None:
            self.task.cancel()
        return rss_mib()


class Stage(Actor):
    def __init__(self) -> None:
        self.port, self.inbox = Channel[Any].open()
        self.task: Any = None
        self.passed = 0

    @endpoint
    async def get_port(self) -> Port[Any]:
        return self.port

    @endpoint
    async def start(self, downstream: Port[Any]) -> None:
        async def relay() -> None:
            while True:
                item = await self.inbox.recv()
                item["scored"] = True
                downstream.send(item)
                self.passed += 1

        self.task = asyncio.get_running_loop().create_task(relay())

    @endpoint
    async def stats(self) -> tuple[int, float]:
        return self.passed, rss_mib()


class Trainer(Actor):
    def __init__(self, generators: Any) -> None:
        self.generators = generators
        self.port, self.inbox = Channel[Any].open()
        self.version = 0

    @endpoint
    async def get_port(self) -> Port[Any]:
        return self.port

    @endpoint
    async def step(self, batch: int) -> int:
        for _ in range(batch):
            await self.inbox.recv()
        self.version += 1
        send(self.generators.update_weights, (tensor(1024), self.version), {}, selection="choose")
        return self.version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--every", type=int, default=0, help="report every N steps")
    parser.add_argument("--step-timeout", type=float, default=60.0)
    args = parser.parse_args()
    generators = this_host().spawn_procs(per_host={"procs": 4}).spawn("generators", Generator)
    stages = this_host().spawn_procs(per_host={"procs": 3})
    scorer = stages.slice(procs=0).spawn("scorer", Stage)
    reference = stages.slice(procs=1).spawn("reference", Stage)
    trainer = stages.slice(procs=2).spawn("trainer", Trainer, generators)
    scorer_port = scorer.get_port.call_one().get(timeout=120)
    reference_port = reference.get_port.call_one().get(timeout=120)
    trainer_port = trainer.get_port.call_one().get(timeout=120)
    reference.start.call_one(trainer_port).get(timeout=120)
    scorer.start.call_one(reference_port).get(timeout=120)
    for rank in range(4):
        generators.slice(procs=rank).start.call_one(scorer_port, rank).get(timeout=120)
    start = time.monotonic()
    done, peak, failure = 0, 0.0, None
    try:
        for step in range(1, args.steps + 1):
            trainer.step.call_one(args.batch).get(timeout=args.step_timeout)
            done = step
            if args.every and step % args.every == 0:
                _, scorer_rss = scorer.stats.call_one().get(timeout=args.step_timeout)
                peak = max(peak, scorer_rss)
                seconds = round(time.monotonic() - start, 2)
                print(json.dumps({"step": step, "seconds": seconds, "scorer_rss_mib": scorer_rss}))
                sys.stdout.flush()
    except TimeoutError:
        failure = f"step {done + 1} took more than {args.step_timeout}s"
    elapsed = time.monotonic() - start
    passed, scorer_rss = scorer.stats.call_one().get(timeout=120)
    generator_rss = max(generators.halt.call().get(timeout=120).values())
    result = {
        "steps": done,
        "seconds": round(elapsed, 2),
        "steps_per_second": round(done / elapsed, 1),
        "scorer_passed": passed,
        "scorer_rss_mib": round(max(peak, scorer_rss), 1),
        "generator_rss_end_mib": round(generator_rss, 1),
        "failure": failure,
    }
    print(json.dumps(result), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
