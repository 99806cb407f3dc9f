"""Supervision with Monarch: catch a crashed trainer, and let a manager restart its workers.

Run it with ``hatch run python examples/supervision.py``. Upstream Monarch's API throughout.
"""

from __future__ import annotations

import os

import monarch.actor
from monarch.actor import Actor, MeshFailure, SupervisionError, endpoint, this_host


class Trainer(Actor):
    @endpoint
    def step(self) -> int:
        return os.getpid()

    @endpoint
    def crash(self) -> None:
        os._exit(1)


class Manager(Actor):
    """Owns a mesh of trainers; when one dies it starts a fresh mesh (and says so)."""

    def __init__(self) -> None:
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.name = "trainers"
        self.trainers = self.procs.spawn(self.name, Trainer)
        self.restarts = 0

    @endpoint
    def crash_one(self) -> None:
        self.trainers.slice(gpus=1).crash.broadcast()

    @endpoint
    def train(self) -> tuple[int, list[int]]:
        pids: list[int] = self.trainers.step.call().get().values()
        return self.restarts, pids

    def __supervise__(self, failure: MeshFailure) -> bool:
        if failure.mesh_name.rsplit("-", 1)[0] != self.name:
            # Not the current trainers: their procs' log forwarder, which fails with them
            # (as upstream's does), or a mesh already replaced. Nothing more to restart.
            return True
        print(f"  manager: {failure.report()}; restarting the trainers")
        self.procs.stop().get()
        self.procs = this_host().spawn_procs(per_host={"gpus": 2})
        self.restarts += 1
        self.name = f"trainers{self.restarts}"
        self.trainers = self.procs.spawn(self.name, Trainer)
        return True  # handled: nothing climbs to the client


def main() -> None:
    # Failures nobody handles reach the client's hook; the default ends the client.
    monarch.actor.unhandled_fault_hook = lambda f: print(f"  client fault hook: {f.report()}")

    print("== catch a crashed trainer with try/except")
    trainer = this_host().spawn_procs(per_host={"gpus": 1}).spawn("solo", Trainer)
    try:
        trainer.crash.call_one().get(timeout=30)
    except SupervisionError as error:
        print(f"  caught SupervisionError: {str(error).splitlines()[0][:90]}")

    print("== a manager restarts its failed workers")
    manager = this_host().spawn_procs(per_host={"m": 1}).spawn("manager", Manager)
    restarts, pids = manager.train.call_one().get(timeout=30)
    print(f"  training on pids {pids} (restarts: {restarts})")
    manager.crash_one.call_one().get(timeout=30)
    while restarts == 0:  # __supervise__ runs between the manager's messages
        try:
            restarts, pids = manager.train.call_one().get(timeout=30)
        except SupervisionError:
            print("  a step hit the dead trainer before the manager heard of it; retrying")
    print(f"  training again on pids {pids} (restarts: {restarts})")


if __name__ == "__main__":
    main()
