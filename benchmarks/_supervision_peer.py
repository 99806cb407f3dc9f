"""A Monarch controller for supervision_bench.py, driven over stdin/stdout (JSON lines).

    python _supervision_peer.py INTERVAL TIMEOUT     (heartbeat settings, e.g. 200ms 1500ms)

Each request ``{"workers": [ADDR, ...]}`` (or ``{"workers": []}`` for a proc on this host,
spawned with ``this_host()``) spawns one proc with an actor on it, starts a call that blocks
in that actor, and answers ``{"pids": [...]}`` once the call is running. The benchmark then
injects a fault; this process answers how the pending call ended, when (CLOCK_MONOTONIC,
which is system-wide, so comparable with the benchmark's clock), and when the failure reached
``monarch.actor.unhandled_fault_hook``. A peer that has attached to workers listens on TCP,
so same-host figures come from a peer that never attaches.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import monarch.actor
from monarch.actor import Actor, attach_to_workers, endpoint, this_host
from monarch.config import configure

hooked: list[float] = []
"""When each failure reached the fault hook."""


def record(failure: Any) -> None:
    hooked.append(time.monotonic())


class Blocker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def block(self, marker: str) -> None:
        Path(marker).touch()
        threading.Event().wait(600)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def arm(workers: list[str], marker: Path, count: int) -> None:
    if workers:
        hosts = attach_to_workers(workers=workers, ca="trust_all_connections")
    else:
        hosts = this_host()
    actor = hosts.spawn_procs(per_host={"gpus": 1}).spawn(f"victim{count}", Blocker)
    pids: list[int] = actor.pid.call().get(timeout=60).values()
    pending = actor.block.call(str(marker))
    deadline = time.monotonic() + 60
    while not marker.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the blocking call did not start within 60 s")
        time.sleep(0.005)
    before = len(hooked)
    emit(pids=pids)
    error: str | None
    try:
        pending.get(timeout=120)
    except Exception as exc:  # noqa: BLE001 - the figure is when and how it failed
        at = time.monotonic()
        error, message = type(exc).__name__, str(exc)
    else:
        at, error, message = time.monotonic(), None, "the call returned"
    deadline = time.monotonic() + 5
    while len(hooked) == before and time.monotonic() < deadline:
        time.sleep(0.001)
    hook_at = hooked[before] if len(hooked) > before else None
    emit(error=error, message=message, at=at, hook_at=hook_at)


def main() -> None:
    interval, timeout = sys.argv[1:3]
    setattr(monarch.actor, "unhandled_fault_hook", record)  # noqa: B010 - as a user would
    configure(heartbeat_interval=interval, heartbeat_timeout=timeout)
    markers = Path(tempfile.mkdtemp(prefix="supervision-bench-"))
    try:
        for count, line in enumerate(sys.stdin):
            request = json.loads(line)
            try:
                arm(request["workers"], markers / str(count), count)
            except Exception as exc:  # noqa: BLE001 - reported to the benchmark
                emit(failed=f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(markers, ignore_errors=True)


if __name__ == "__main__":
    main()
