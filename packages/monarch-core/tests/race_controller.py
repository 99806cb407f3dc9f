"""The controller of test_races.py: casts, completions and proc deaths from several threads.

Run as its own process, so that its runtime gets the event loop the test asks for
(``MONARCH_EVENT_LOOP``). It reads one JSON request a line and answers one JSON line:

    {"schedule": {"procs": N, "threads": [[OP, ...], ...]}}
        N fresh procs with an actor each; every thread runs its ops at once (a barrier
        starts them), then every future made is waited on with one deadline.
        OP: ["call", a, b, k]   k calls of mesh.slice(gpus=slice(a, b)).ping
            ["one", r, k]       k call_one to rank r
            ["choose", k]       k choose
            ["stream", k]       k streams (a future per rank)
            ["raise", k]        k calls whose endpoint raises (an error reply)
            ["wait"]            wait for this thread's futures so far (then casts are
                                made by this thread itself, not by the loop)
            ["kill", r]         SIGKILL rank r's process from this thread
            ["exit", r]         rank r's actor ends its own process (os._exit)
    {"stress": {"calls": C, "threads": T}}
        2 procs, one killed; T threads make C calls in all, each waiting on its call
        before the next (so each is cast by its own thread): all must fail, none hang.

Answer: {"futures": made, "hung": [what did not end], "bad": [wrong values],
"logged": [exceptions the runtime logged]}.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import monarch.actor
from monarch.actor import (
    Actor,
    ActorError,
    SupervisionError,
    ValueMesh,
    current_rank,
    endpoint,
    this_host,
)
from monarch.core import current_runtime

DEADLINE = 20.0
"""Seconds every future of a request has to end, once its threads are done casting."""

monarch.actor.unhandled_fault_hook = lambda failure: None  # the deaths are deliberate


class Logged(logging.Handler):
    """Exceptions the runtime logged (a failed loop request or watcher): each one a bug."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is not None and record.name.startswith("monarch"):
            self.records.append(f"{record.getMessage()}: {record.exc_info[1]!r}")


logged = Logged()
logging.getLogger().addHandler(logged)


class Target(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def ping(self) -> int:
        return current_rank().rank

    @endpoint
    def fail(self) -> None:
        raise ValueError("as asked")

    @endpoint
    def exit(self) -> None:
        os._exit(3)


class Run:
    """The futures of one request, and how each must end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.futures: list[tuple[str, Any, Any]] = []  # (what, future, check of its value)

    def add(self, what: str, future: Any, check: Any = None) -> None:
        with self.lock:
            self.futures.append((what, future, check))

    def settle(self, deadline: float) -> dict[str, Any]:
        hung: list[str] = []
        bad: list[str] = []
        for what, future, check in self.futures:
            try:
                value = future.get(timeout=max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                hung.append(what)
                continue
            except (SupervisionError, ActorError) as exc:
                if what.startswith("raise") and isinstance(exc, ActorError):
                    continue
                if not isinstance(exc, SupervisionError):
                    bad.append(f"{what}: {exc!r}")
                continue
            except Exception as exc:  # noqa: BLE001 - reported to the test
                bad.append(f"{what}: {exc!r}")
                continue
            if check is not None and not check(value):
                bad.append(f"{what}: {value!r}")
        return {"futures": len(self.futures), "hung": hung, "bad": bad}


def is_ranks(count: int) -> Any:
    def check(value: Any) -> bool:
        return isinstance(value, ValueMesh) and sorted(value.values()) == list(range(count))

    return check


def run_ops(run: Run, mesh: Any, pids: list[int], ops: list[list[Any]], start: Any) -> None:
    mine: list[Any] = []

    def add(what: str, future: Any, check: Any = None) -> None:
        mine.append(future)
        run.add(what, future, check)

    start.wait()
    for op in ops:
        kind = op[0]
        if kind == "call":
            _, a, b, k = op
            part = mesh.slice(gpus=slice(a, b))
            for _ in range(k):
                add(f"call {a}:{b}", part.ping.call(), is_ranks(b - a))
        elif kind == "one":
            _, r, k = op
            for _ in range(k):
                add(f"one {r}", mesh.slice(gpus=r).ping.call_one(), lambda v: v == 0)
        elif kind == "choose":
            for _ in range(op[1]):
                add("choose", mesh.ping.choose(), lambda v: v == 0)
        elif kind == "stream":
            for _ in range(op[1]):
                try:
                    arrivals = list(mesh.ping.stream())
                except SupervisionError:
                    continue
                for arrival in arrivals:
                    add("stream", arrival)
        elif kind == "raise":
            for _ in range(op[1]):
                add("raise", mesh.fail.call())
        elif kind == "wait":
            for future in mine:
                try:
                    future.exception(timeout=DEADLINE)
                except TimeoutError:
                    return  # reported as hung

        elif kind == "kill":
            try:
                os.kill(pids[op[1]], signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif kind == "exit":
            mesh.slice(gpus=op[1]).exit.broadcast()


def schedule(spec: dict[str, Any]) -> dict[str, Any]:
    procs = this_host().spawn_procs(per_host={"gpus": spec["procs"]})
    mesh = procs.spawn("target", Target)
    pids = list(mesh.pid.call().get(timeout=60).values())
    run = Run()
    start = threading.Barrier(len(spec["threads"]))
    threads = [
        threading.Thread(target=run_ops, args=(run, mesh, pids, ops, start))
        for ops in spec["threads"]
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = run.settle(time.monotonic() + DEADLINE)
    for pid in pids:  # the next request starts afresh
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return result


def stress(spec: dict[str, Any]) -> dict[str, Any]:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("target", Target)
    pids = list(mesh.pid.call().get(timeout=60).values())
    os.kill(pids[0], signal.SIGKILL)
    # Until a call fails: the death is then declared, and every later call finds it so.
    while mesh.ping.call().exception(timeout=DEADLINE) is None:
        pass
    hung: list[str] = []
    bad: list[str] = []

    def caller(calls: int) -> None:
        for _ in range(calls):
            try:
                mesh.ping.call().get(timeout=DEADLINE)
            except SupervisionError:
                continue
            except TimeoutError:
                hung.append("call to a mesh with a dead proc")
            except Exception as exc:  # noqa: BLE001 - reported to the test
                bad.append(repr(exc))
            else:
                bad.append("a value from a mesh with a dead proc")

    threads = [
        threading.Thread(target=caller, args=(spec["calls"] // spec["threads"],))
        for _ in range(spec["threads"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.kill(pids[1], signal.SIGKILL)
    return {"futures": spec["calls"], "hung": hung, "bad": bad}


def main() -> None:
    print(json.dumps({"loop": type(current_runtime().loop).__module__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        logged.records.clear()
        if "schedule" in request:
            answer = schedule(request["schedule"])
        else:
            answer = stress(request["stress"])
        answer["logged"] = list(logged.records)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
