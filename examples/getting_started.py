"""Getting started with Monarch: a tour of meshes, adverbs, slicing, ports and errors.

Run it with ``hatch run demo``. Everything here is upstream Monarch's API
(``torchmonarch`` 0.7.0): this script runs unchanged against either.
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap

import monarch.actor
from monarch.actor import (
    Accumulator,
    Actor,
    ActorError,
    Channel,
    MeshFailure,
    Port,
    SupervisionError,
    context,
    current_rank,
    endpoint,
    this_host,
)


class Trainer(Actor):
    """One per process: holds a shard of state and answers endpoint calls."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.steps = 0

    @endpoint
    def train(self, step: int) -> float:
        self.steps += 1
        # The rank the actor was spawned at (current_rank() is relative to the slice called).
        return self.lr * step * (context().actor_instance.rank["gpus"] + 1)

    @endpoint
    def where(self) -> str:
        return f"pid {os.getpid()}, rank {dict(current_rank())}"

    @endpoint
    def progress(self, port: Port[str], upto: int) -> None:
        for step in range(upto):
            port.send(f"rank {current_rank().rank} finished step {step}")

    @endpoint
    def explode(self) -> None:
        raise ValueError("diverged: loss is nan")

    @endpoint
    def crash(self) -> None:
        os._exit(1)


class Coordinator(Actor):
    """Actors can hold other meshes and call them, like the client does."""

    @endpoint
    async def total_steps(self, trainers: Trainer) -> int:
        counts = await trainers.train.call(0)
        return len(counts)


def section(title: str) -> None:
    print(f"\n== {title}")


def main() -> None:
    section("meshes")
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    trainers = procs.spawn("trainers", Trainer, lr=0.1)
    print("proc mesh:", procs, " actor mesh:", trainers)
    for point, where in trainers.where.call().get().items():
        print(f"  {point}: {where}")

    section("adverbs: call, call_one, choose, stream, broadcast")
    print("call      ->", trainers.train.call(step=1).get().values())
    print("call_one  ->", trainers.slice(gpus=2).train.call_one(step=1).get())
    print("choose    ->", trainers.train.choose(step=1).get())
    print("stream    ->", sorted(f.get() for f in trainers.train.stream(step=2)))
    trainers.train.broadcast(step=3)  # fire and forget; ordered before what follows
    print("broadcast -> (no reply)")

    section("slicing")
    first_half = trainers.slice(gpus=slice(0, 2))
    print("gpus 0-1:", first_half.train.call(step=1).get())
    grid = trainers.split(gpus=("row", "col"), col=2)
    print("sizes:", trainers.sizes, "size:", trainers.size(), "split:", grid.sizes)
    print("row 1 of the grid:", grid.slice(row=1).train.call(step=1).get().values())

    section("ports and accumulators")
    port, receiver = Channel[str].open()
    trainers.slice(gpus=0).progress.call_one(port, 3).get()
    for _ in range(3):
        print(" ", receiver.recv().get())
    total = Accumulator(trainers.train, 0.0, lambda acc, x: acc + x)
    print("sum over ranks:", round(total.accumulate(step=1).get(), 3))

    section("meshes as arguments")
    coordinator = procs.slice(gpus=0).spawn("coordinator", Coordinator)
    print("coordinator saw", coordinator.total_steps.call_one(trainers).get(), "trainers")

    section("async")

    async def async_main() -> list[float]:
        results = await trainers.train.call(step=4)
        values: list[float] = results.values()
        return values

    print("awaited from asyncio:", asyncio.run(async_main()))

    section("errors")
    try:
        trainers.slice(gpus=1).explode.call_one().get()
    except ActorError as error:
        print("caught ActorError:", repr(error.exception))
    print("the actor lives on:", trainers.slice(gpus=1).train.call_one(step=1).get())

    # A crash nobody supervises reaches the client's fault hook; the default one ends the
    # client (as upstream's does). Here we only report it, and carry on.
    def report(failure: MeshFailure) -> None:
        # On the runtime's thread, beside this one: one write per report, so the lines of
        # the two threads do not interleave (print() writes its parts one by one).
        sys.stdout.write(f"fault hook: {failure.report()}\n")

    monarch.actor.unhandled_fault_hook = report
    doomed = this_host().spawn_procs(per_host={"gpus": 1}).spawn("doomed", Trainer, lr=1.0)
    try:
        doomed.crash.call_one().get(timeout=30)
    except SupervisionError as error:
        print("caught SupervisionError:", textwrap.indent(str(error), "  ").strip())

    section("stop")
    procs.stop().get()
    print("stopped", procs)


if __name__ == "__main__":
    main()
