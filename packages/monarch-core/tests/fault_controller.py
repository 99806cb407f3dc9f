"""Controller scripts for test_faults.py, each run as its own process.

A controller that attaches to workers must listen on TCP, and one scenario kills the
controller itself, so these run in fresh processes. Each prints JSON lines to stdout and
reads lines from stdin where the test acts in between (injects a fault, heals it).
Heartbeats are 200 ms / 1.5 s (``HEARTBEAT``). Unhandled failures are recorded, not fatal.

    python fault_controller.py fault ADDR_VICTIM ADDR_SURVIVOR MARKER
        ready -> (test injects a fault on the victim host) -> pending
        -> (test heals, sends a line) -> after -> (waits to be killed)
    python fault_controller.py loss ADDR_VICTIM ADDR_SURVIVOR SECONDS HEARTBEAT_TIMEOUT
        ready -> (test drops packets, sends a line) -> lossy
        -> (test heals, sends a line) -> after -> (waits to be killed)
    python fault_controller.py orphans ADDR_WORKER MARKER_DIR
        ready (every pid, calls pending on all of them) -> (waits to be killed)
"""

from __future__ import annotations

import os
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller_report import emit, outcome

import monarch.actor
from monarch.actor import Actor, attach_to_workers, endpoint, this_host
from monarch.config import configure

HEARTBEAT = {"heartbeat_interval": "200ms", "heartbeat_timeout": "1500ms"}
ACKED = 10
"""Calls each actor answered before the fault: survivors must still count them."""

failures: list[Any] = []


def record(failure: Any) -> None:
    """The unhandled fault hook: note the failure (the default would end this process)."""
    failures.append(failure)
    print(f"unhandled: {failure}", file=sys.stderr, flush=True)


class Victim(Actor):
    """Defined in ``__main__``, so it travels to the procs by value."""

    def __init__(self) -> None:
        self.count = 0
        self.kids: Any = None

    @endpoint
    def info(self) -> dict[str, int]:
        return {"pid": os.getpid(), "ppid": os.getppid()}

    @endpoint
    def incr(self) -> int:
        self.count += 1
        return self.count

    @endpoint
    def get(self) -> int:
        return self.count

    @endpoint
    def block(self, marker: str, seconds: float) -> str:
        Path(marker).touch()
        threading.Event().wait(seconds)
        return "woke"

    @endpoint
    def echo(self, data: bytes) -> tuple[int, int]:
        return len(data), zlib.crc32(data)

    @endpoint
    def spawn_kid(self) -> int:
        """Procs of its own (grandchildren of the controller): their pid."""
        self.kids = this_host().spawn_procs(per_host={"kids": 1}).spawn("kid", Victim)
        pid: int = self.kids.info.call_one().get(timeout=30)["pid"]
        return pid


def recorded_failures(timeout: float) -> list[dict[str, Any]]:
    """The failures that reached the fault hook, waiting up to ``timeout`` s for one."""
    deadline = time.monotonic() + timeout
    while not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    return [
        {
            "mesh_name": getattr(f, "mesh_name", None),
            "crashed_ranks": getattr(f, "crashed_ranks", None),
            "text": str(f),
        }
        for f in failures
    ]


def spawn_on(workers: list[str], name: str) -> tuple[Any, list[dict[str, int]]]:
    """Victims on 2 procs per worker, each having answered ``ACKED`` calls."""
    hosts = attach_to_workers(workers=workers, ca="trust_all_connections")
    actors = hosts.spawn_procs(per_host={"gpus": 2}).spawn(name, Victim)
    info = actors.info.call().get(timeout=30)
    procs = [{**dict(point), **value} for point, value in info.items()]
    for _ in range(ACKED):
        actors.incr.call().get(timeout=30)
    return actors, procs


def fault(victim: str, survivor: str, marker: str) -> None:
    actors, procs = spawn_on([victim, survivor], "faulty")
    pending = actors.slice(hosts=0, gpus=0).block.call_one(marker, 60)
    queued = actors.slice(hosts=0, gpus=0).get.call_one()  # waits behind the blocked call
    whole = actors.get.call()  # so does this one, on that rank
    emit(ready=True, procs=procs)
    emit(pending=outcome(pending, 30), queued=outcome(queued, 30), whole=outcome(whole, 30))
    sys.stdin.readline()  # the test has healed the fault (or resumed the host)
    emit(
        later=outcome(actors.get.call().then(lambda v: v.values()), 30),
        victim_host=outcome(actors.slice(hosts=0).get.call().then(lambda v: v.values()), 30),
        survivor=outcome(actors.slice(hosts=1).get.call().then(lambda v: v.values()), 30),
        failures=recorded_failures(5),
    )
    sys.stdin.readline()  # the test kills this controller here


def loss(victim: str, survivor: str, seconds: str, heartbeat_timeout: str) -> None:
    configure(heartbeat_timeout=heartbeat_timeout)  # room for TCP to retransmit
    actors, procs = spawn_on([victim, survivor], "lossy")
    emit(ready=True, procs=procs)
    sys.stdin.readline()  # the test drops packets to and from the victim host now
    one = actors.slice(hosts=0, gpus=0)
    data = bytes(range(256)) * 256  # 64 KiB: many segments to lose
    expect = [len(data), zlib.crc32(data)]
    calls: list[dict[str, Any]] = []
    start = time.monotonic()
    while time.monotonic() - start < float(seconds):
        result = outcome(one.echo.call_one(data).then(list), 30)
        result["ok"] = result.get("value") == expect
        result.pop("value", None)
        calls.append(result)
        if "error" in result:
            break  # declared dead: every later call fails the same way
    after_loss = outcome(one.incr.call_one(), 30)
    emit(calls=calls, after_loss=after_loss, seconds=round(time.monotonic() - start, 3))
    sys.stdin.readline()  # healed
    emit(
        victim=outcome(one.get.call_one(), 30),
        survivor=outcome(actors.slice(hosts=1).get.call().then(lambda v: v.values()), 30),
        failures=recorded_failures(0),
    )
    sys.stdin.readline()


def orphans(worker: str, marker_dir: str) -> None:
    # Attach first: local procs spawned before attach_to_workers stall after it (a bug).
    remote = spawn_on([worker], "remote")[0]
    local = this_host().spawn_procs(per_host={"gpus": 2}).spawn("local", Victim)
    kid = local.slice(gpus=0).spawn_kid.call_one().get(timeout=60)
    pids = [v["pid"] for v in local.info.call().get(timeout=30).values()]
    pids += [v["pid"] for v in remote.info.call().get(timeout=30).values()]
    # Calls in flight when the controller dies: every actor is busy in one.
    local.slice(gpus=1).block.call_one(str(Path(marker_dir) / "local"), 60)
    remote.slice(gpus=0).block.call_one(str(Path(marker_dir) / "remote"), 60)
    emit(pids=pids, kid=kid, controller=os.getpid())
    sys.stdin.readline()  # the test kills this controller here


SCENARIOS: dict[str, Callable[..., None]] = {
    "fault": fault,
    "loss": loss,
    "orphans": orphans,
}

if __name__ == "__main__":
    setattr(monarch.actor, "unhandled_fault_hook", record)  # noqa: B010 - as a user would
    configure(**HEARTBEAT)
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
