"""A user's script with a job across several hosts, driven line by line by a test
(test_slurm_netns.py); it prints one JSON line per step.

    python mesh_script.py slurm NODES LOGS

1. state() of a SlurmJob of NODES nodes; a Supervisor actor (on a proc of this host) is
   handed the job's host mesh, spawns 2 procs a host there and an actor on each, casts to
   them all (each counts it) and calls them all: prints where each actor runs and what it
   counted.
2. After a line on stdin, a JSON list of ranks (the test has cut their host off, killed
   its worker, cancelled the step): waits until the Supervisor's ``__supervise__`` has
   recorded failures of its actors naming all of them, then calls every actor again; prints the
   failures and what the call raised, and when.
3. After another line: ``job.kill()``, prints ``{"killed": true}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import monarch.actor
from monarch.actor import Actor, MeshFailure, SupervisionError, endpoint, this_host
from monarch.core import HostMesh
from monarch.job import SlurmJob


class Where(Actor):
    def __init__(self) -> None:
        self.casts = 0

    @endpoint
    def count(self) -> None:
        self.casts += 1

    @endpoint
    def where(self) -> dict[str, Any]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.0.0.1", 1))  # the address it reaches this client's host from
            address = probe.getsockname()[0]
        return {"pid": os.getpid(), "address": address, "casts": self.casts}


class Supervisor(Actor):
    """Owns the procs and actors on the job's hosts: their failures come to it."""

    def __init__(self) -> None:
        self.failures: list[dict[str, Any]] = []

    @endpoint
    def start(self, hosts: HostMesh) -> list[dict[str, Any]]:
        self.procs = hosts.spawn_procs(per_host={"gpus": 2})
        self.actors = self.procs.spawn("where", Where)
        self.actors.count.broadcast()  # a cast: each actor counts it before the call below
        found = self.actors.where.call().get(timeout=60)
        return [{"point": dict(point), **value} for point, value in found.items()]

    @endpoint
    def failures_seen(self) -> list[dict[str, Any]]:
        return self.failures

    @endpoint
    def call_all(self) -> dict[str, Any]:
        """A call to every actor, some of them gone: it raises at once, it does not hang."""
        started = time.monotonic()
        try:
            value: Any = len(self.actors.where.call().get(timeout=60))
            outcome = {"value": value}
        except SupervisionError as exc:
            outcome = {"error": type(exc).__name__, "message": str(exc)[:500]}
        return {**outcome, "seconds": time.monotonic() - started}

    def __supervise__(self, failure: MeshFailure) -> bool:
        # Its "where" actors' failures; those of their procs' log forwarders ("logger",
        # as upstream's) come here too when the procs end.
        actors = failure.mesh_name.rsplit("-", 1)[0] == "where"
        self.failures.append(
            {
                "mesh": failure.mesh_name,
                "actors": actors,
                "ranks": failure.crashed_ranks,
                "report": failure.report(),
            }
        )
        return True


def say(data: object) -> None:
    print(json.dumps(data), flush=True)


def main() -> None:
    unhandled: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda failure: unhandled.append(failure.report())
    nodes, logs = int(sys.argv[2]), sys.argv[3]
    job = SlurmJob({"hosts": nodes}, sys.executable, monarch_port=0, exclusive=False, log_dir=logs)
    hosts = job.state(cached_path=None).hosts
    supervisor = this_host().spawn_procs().spawn("supervisor", Supervisor)
    say({"actors": supervisor.start.call_one(hosts).get(timeout=120), "jobs": job._jobs})
    expected = set(json.loads(sys.stdin.readline()))
    started = time.monotonic()
    while True:  # polled with a deadline: one failure per rank, as they are noticed
        failures = supervisor.failures_seen.call_one().get(timeout=60)
        failed = {rank for failure in failures if failure["actors"] for rank in failure["ranks"]}
        if failed >= expected or time.monotonic() > started + 60:
            break
        time.sleep(0.05)
    seconds = time.monotonic() - started
    after = supervisor.call_all.call_one().get(timeout=120)
    say({"failures": failures, "seconds": seconds, "call": after, "unhandled": unhandled})
    sys.stdin.readline()
    job.kill()
    say({"killed": True})


if __name__ == "__main__":
    main()
