"""The controller of a job over many namespace hosts (``many_hosts.py`` runs it on host 1).

It attaches to the workers (TLS, the job secret from the environment), spawns ``PER_HOST``
procs on each with a ``Member`` actor, and then obeys one JSON command per line on stdin,
answering each with one JSON line on stdout. Times are ``time.monotonic()`` (CLOCK_MONOTONIC,
one clock for every namespace of the machine), so the driver compares them with its own.

    python hosts_controller.py CA KEY PER_HOST TICKS_DIR ADDR...

Meanwhile a thread casts ``tick`` to the hosts still in the job (``flow``), so faults
happen while casts keep flowing; each ``Member`` appends the time of every tick it runs to
``TICKS_DIR/<pid>``: what the driver reads to see that a proc written off runs nothing more.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import monarch.actor
from monarch.actor import Actor, MeshFailure, ValueMesh, endpoint
from monarch.config import configure
from monarch.core._host._attach import attach_to_workers
from monarch.core._runtime import current_runtime

FLOW_PERIOD = 0.05
"""Seconds between two casts of the background flow."""


class Member(Actor):
    """One per proc; defined in ``__main__``, so it travels to the procs by value."""

    def __init__(self, ticks: str) -> None:
        self.ticks = Path(ticks) / str(os.getpid())

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, value: int) -> int:
        return value

    @endpoint
    def hold(self, seconds: float) -> float:
        """Busy for ``seconds`` (a call in flight when a host fails)."""
        threading.Event().wait(seconds)
        return seconds

    @endpoint
    def tick(self) -> None:
        with self.ticks.open("a") as f:
            f.write(f"{time.monotonic()}\n")


class Owner(Actor):
    """Spawns a mesh of its own over the job's procs: the owner a failure must reach."""

    def __init__(self) -> None:
        self.failures: list[dict[str, Any]] = []

    @endpoint
    def adopt(self, procs: Any, ticks: str) -> int:
        self.children = procs.spawn("children", Member, ticks)
        return len(self.children.pid.call().get(timeout=120).values())

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append({"at": time.monotonic(), "ranks": list(failure.crashed_ranks)})
        return True

    @endpoint
    def seen(self) -> list[dict[str, Any]]:
        return self.failures


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def outcome(future: Any, timeout: float) -> dict[str, Any]:
    """What ``future.get`` did: the value or the error, and when it ended."""
    try:
        value = future.get(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported to the driver
        return {"error": type(exc).__name__, "message": str(exc)[:300], "at": time.monotonic()}
    if isinstance(value, ValueMesh):
        value = value.values()
    return {"value": value, "at": time.monotonic()}


class Job:
    def __init__(self, ca: str, key: str, per_host: int, ticks: str, addrs: list[str]) -> None:
        self.failures: list[dict[str, Any]] = []
        monarch.actor.unhandled_fault_hook = self._hook
        self.ticks = ticks
        self.per_host = per_host
        self.count = len(addrs)
        start = time.monotonic()
        self.hosts = attach_to_workers(workers=addrs, ca=Path(ca), private_key=Path(key))
        self.hosts.initialized.get(timeout=300)
        attached = time.monotonic()
        self.procs = self.hosts.spawn_procs(per_host={"gpus": per_host})
        self.members = self.procs.spawn("members", Member, ticks)
        pids = self.members.pid.call().get(timeout=300)
        spawned = time.monotonic()
        self.pids: list[list[int]] = [[] for _ in addrs]
        for point, pid in pids.items():
            self.pids[point["hosts"]].append(pid)
        owner_procs = self.hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1})
        self.owner = owner_procs.spawn("owner", Owner)
        self.owner.adopt.call_one(self.procs, ticks).get(timeout=300)
        self.owner_procs = owner_procs
        self.live = list(range(self.count))
        """Hosts still in the job: what the flow and ``calls`` cast to."""
        self.halt = threading.Event()
        self.halt.set()
        self.flowing: threading.Thread | None = None
        self.flow_errors: list[str] = []
        self.flow_casts = 0
        emit(
            attach_s=attached - start,
            spawn_s=spawned - attached,
            pids=self.pids,
            controller_pid=os.getpid(),
        )

    def _hook(self, failure: MeshFailure) -> None:
        ranks = list(failure.crashed_ranks)
        self.failures.append({"at": time.monotonic(), "mesh": failure.mesh_name, "ranks": ranks})

    def survivors(self) -> Any:
        """The members on the hosts still in the job (a slice per contiguous run)."""
        return [self.members.slice(hosts=slice(a, b)) for a, b in runs(self.live)]

    # -- commands -------------------------------------------------------------------------

    def calls(self, reps: int) -> dict[str, Any]:
        """Gathered calls to every live host's procs, and broadcasts then a call: ms each."""
        call_ms, bcast_ms = [], []
        for i in range(reps):
            start = time.perf_counter()
            for part in self.survivors():
                part.echo.call(i).get(timeout=60)
            call_ms.append((time.perf_counter() - start) * 1000)
        for _ in range(reps):
            start = time.perf_counter()
            parts = self.survivors()
            for _ in range(10):
                for part in parts:
                    part.echo.broadcast(0)
            for part in parts:
                part.echo.call(0).get(timeout=60)
            bcast_ms.append((time.perf_counter() - start) * 1000)
        return {"call_ms": call_ms, "bcast10_ms": bcast_ms}

    def pending(self, seconds: float) -> dict[str, Any]:
        """A gathered call to every live host, in flight: answered by ``fault``."""
        self.held: list[dict[str, Any]] = []
        self.waiting = [
            threading.Thread(target=lambda f=f: self.held.append(outcome(f, 120)), daemon=True)
            for f in [part.hold.call(seconds) for part in self.survivors()]
        ]
        for thread in self.waiting:
            thread.start()
        return {"sent": time.monotonic()}

    def fault(self, host: int, within: float) -> dict[str, Any]:
        """How the call in flight ended now that ``host`` failed, then the hosts left."""
        for thread in self.waiting:
            thread.join(within)
        failed = sorted((r for r in self.held if "error" in r), key=lambda r: float(r["at"]))
        self.live.remove(host)
        survivors = [outcome(p.echo.call(1), 60) for p in self.survivors()]
        owner = outcome(self.owner.seen.call_one(), 60)
        return {
            "pending": failed[0] if failed else {"value": "no call failed"},
            "survivors": survivors,
            "client_failures": self.failures,
            "owner_failures": owner.get("value", owner),
        }

    def leave(self, host: int) -> dict[str, Any]:
        """``host`` is written off: the flow and later calls leave it out."""
        if host in self.live:
            self.live.remove(host)
        return {"live": self.live}

    def flow(self, on: bool) -> dict[str, Any]:
        """Start or stop casting ``tick`` to the live hosts every ``FLOW_PERIOD`` s."""
        if on and self.halt.is_set():
            self.halt.clear()
            self.flowing = threading.Thread(target=self._flow, daemon=True)
            self.flowing.start()
        elif not on:
            self.halt.set()
            if self.flowing is not None:
                self.flowing.join(60)  # its cast in flight ends first
        return {"casts": self.flow_casts, "errors": self.flow_errors[-5:]}

    def _flow(self) -> None:
        while not self.halt.wait(FLOW_PERIOD):
            try:
                parts = self.survivors()
                for part in parts:
                    part.tick.broadcast()
                for part in parts:
                    part.echo.call(0).get(timeout=30)
                self.flow_casts += 1
            except Exception as exc:  # noqa: BLE001 - reported to the driver
                self.flow_errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    def counters(self) -> dict[str, Any]:
        """The controller's own books: messages sent and received so far, and the
        connections it has open, by direction (``received`` is 0 where the runtime does
        not count it: an older checkout, in an A/B run)."""
        runtime = current_runtime()
        return {
            "posted": runtime.posted,
            "received": getattr(runtime, "received", 0),
            "outbound": len(runtime._writers) + len(runtime._lanes),
            "inbound": sum(len(conns) for conns in runtime._inbound.values()),
            "dialed": sum(runtime.dialed.values()),
            "now": time.monotonic(),
        }

    def latency(self, reps: int) -> dict[str, Any]:
        """Round trips to one actor (each host's first, in turn; the first call to each is
        timed apart, as it may open the connection) and gathered calls to all: ms, and the
        controller's messages per gathered call."""
        firsts = [self.members.slice(hosts=h, gpus=0) for h in self.live]
        first_ms = []
        for one in firsts:
            start = time.perf_counter()
            one.echo.call_one(0).get(timeout=60)
            first_ms.append((time.perf_counter() - start) * 1000)
        one_ms = []
        for i in range(reps):
            one = firsts[i % len(firsts)]
            start = time.perf_counter()
            one.echo.call_one(i).get(timeout=60)
            one_ms.append((time.perf_counter() - start) * 1000)
        whole = self.members.slice(hosts=slice(min(self.live), max(self.live) + 1))
        whole.echo.call(0).get(timeout=60)
        before = self.counters()
        cast_ms = []
        for i in range(reps):
            start = time.perf_counter()
            whole.echo.call(i).get(timeout=60)
            cast_ms.append((time.perf_counter() - start) * 1000)
        after = self.counters()
        return {
            "first_call_ms": first_ms,
            "one_ms": one_ms,
            "cast_ms": cast_ms,
            "sent_per_cast": (after["posted"] - before["posted"]) / reps,
            "received_per_cast": (after["received"] - before["received"]) / reps,
        }

    def status(self) -> dict[str, Any]:
        return {"client_failures": self.failures, "now": time.monotonic()}

    def stop(self, within: float) -> dict[str, Any]:
        self.halt.set()
        start = time.monotonic()
        stopped = outcome(self.procs.stop(), within)
        owner = outcome(self.owner_procs.stop(), within)
        return {"stop": stopped, "owner_stop": owner, "stop_s": time.monotonic() - start}


def runs(hosts: list[int]) -> list[tuple[int, int]]:
    """``hosts`` (sorted) as half-open ranges of consecutive numbers."""
    out: list[tuple[int, int]] = []
    for h in hosts:
        if out and out[-1][1] == h:
            out[-1] = (out[-1][0], h + 1)
        else:
            out.append((h, h + 1))
    return out


def main(ca: str, key: str, per_host: str, ticks: str, *addrs: str) -> None:
    configure(
        heartbeat_interval=os.environ.get("MONARCH_HEARTBEAT_INTERVAL", "200ms"),
        heartbeat_timeout=os.environ.get("MONARCH_HEARTBEAT_TIMEOUT", "1500ms"),
        # 256 procs over 32 hosts on a loaded 2-core machine may take longer than 30 s.
        host_spawn_ready_timeout="180s",
    )
    job = Job(ca, key, int(per_host), ticks, list(addrs))
    commands: dict[str, Callable[..., dict[str, Any]]] = {
        "calls": job.calls,
        "pending": job.pending,
        "fault": job.fault,
        "leave": job.leave,
        "flow": job.flow,
        "status": job.status,
        "counters": job.counters,
        "latency": job.latency,
        "stop": job.stop,
    }
    for line in sys.stdin:
        command = json.loads(line)
        emit(**commands[command.pop("do")](**command))


if __name__ == "__main__":
    main(*sys.argv[1:])
