"""Controller scripts for test_remote_hosts.py, each run as its own process.

A controller attaching to remote workers changes its process's runtime (it must listen on
TCP), so each scenario runs in a fresh process, which is also how the network-namespace
test puts the controller on its own "host". Each step prints one JSON line to stdout.

    python remote_controller.py local ADDR0 PID0 ADDR1 PID1   (then waits to be killed)
    python remote_controller.py wrong-secret ADDR
    python remote_controller.py netns ADDR_H2 ADDR_H3   (waits for a line on stdin midway)
    python remote_controller.py shutdown ADDR0 ADDR1
    python remote_controller.py tls CA KEY ADDR...   (PEM paths; or trust_all_connections -)
    python remote_controller.py busy ADDR SECONDS
    python remote_controller.py gateway GATEWAY ADDR   (waits for a line on stdin midway)
    python remote_controller.py root-far ADDR
    python remote_controller.py frozen ADDR WORKER_PID during|after
    python remote_controller.py spawn ADDR
    python remote_controller.py connections ADDR0 ADDR1
    python remote_controller.py flood ADDR COUNT   (no controller: silent connections to ADDR;
                                                  each line on stdin: how many were closed)
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from controller_report import emit, outcome

import monarch.actor
from monarch.actor import Actor, endpoint
from monarch.config import configure
from monarch.core import current_runtime
from monarch.core._host._attach import attach_to_workers
from monarch.core._runtime._netaddr import _interface_ipv4


class Where(Actor):
    """Defined in ``__main__``, so it travels to the workers' procs by value."""

    @endpoint
    def where(self) -> dict[str, Any]:
        # The parent's parent is read here, in the call: the test reads the values only after
        # this controller has killed the first host's worker (whose zygote is then re-parented).
        ppid = os.getppid()
        stat = Path(f"/proc/{ppid}/stat").read_text()
        grand = int(stat.rpartition(")")[2].split()[1])
        host = _interface_ipv4()[0]
        return {"pid": os.getpid(), "ppid": ppid, "grandparent": grand, "host": host}

    @endpoint
    def runtime_address(self) -> str:
        from monarch.core import current_runtime

        return current_runtime().address

    @endpoint
    def block(self, seconds: float) -> None:
        time.sleep(seconds)


class Hog(Actor):
    """An async actor whose endpoint keeps the CPU and the GIL busy (a computation, an import)."""

    @endpoint
    async def compute(self, seconds: float) -> int:
        end, turns = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            turns += 1
        return turns


def _since(start: float) -> float:
    return round(time.monotonic() - start, 3)


def local(addr0: str, pid0: str, addr1: str, pid1: str) -> None:
    hosts = attach_to_workers(workers=[addr0, addr1], ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    actors = procs.spawn("where", Where)
    first = actors.where.call().get(timeout=30)
    emit(
        host_extent={k: hosts.extent[k] for k in hosts.extent},
        extent={k: procs.extent[k] for k in procs.extent},
        values=[{**dict(point), **value} for point, value in first.items()],
    )
    pending = actors.slice(hosts=0).block.call(60)
    os.kill(int(pid0), signal.SIGKILL)
    emit(
        pending=outcome(pending, 30),
        later=outcome(actors.where.call().then(lambda v: v.values()), 30),
        survivor=outcome(actors.slice(hosts=1).where.call().then(lambda v: v.values()), 30),
    )
    sys.stdin.readline()  # the test kills this controller here


def wrong_secret(addr: str) -> None:
    hosts = attach_to_workers(workers=[addr])
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    emit(initialized=outcome(procs.initialized, 30))


def netns(addr2: str, addr3: str) -> None:
    hosts = attach_to_workers(workers=[addr2, addr3], ca="trust_all_connections")
    actors = hosts.spawn_procs(per_host={"gpus": 2}).spawn("where", Where)
    emit(values=[v["host"] for v in actors.where.call().get(timeout=30).values()])
    sys.stdin.readline()  # the test has cut h3 off
    emit(
        cut=outcome(actors.where.call().then(lambda v: v.values()), 30),
        survivor=outcome(actors.slice(hosts=0).where.call().then(lambda v: v.values()), 30),
    )


class Counter(Actor):
    def __init__(self) -> None:
        self.hits = 0

    @endpoint
    def hit(self) -> int:
        self.hits += 1
        return self.hits


class Asker(Actor):
    @endpoint
    def ask(self) -> int:
        counter = monarch.actor.get_or_spawn_controller("counter", Counter).get(timeout=30)
        hits: int = counter.hit.call_one().get(timeout=30)
        return hits


def root_far(addr: str) -> None:
    """The runtime starts on a local socket first (this_host()), then attaches: procs on
    the worker must find the job's root at its network address, not the local one."""
    monarch.actor.this_host()
    hosts = attach_to_workers(workers=[addr], ca="trust_all_connections")
    askers = hosts.spawn_procs(per_host={"gpus": 2}).spawn("askers", Asker)
    emit(asked=outcome(askers.ask.call().then(lambda v: sorted(v.values())), 60))


def shutdown(addr0: str, addr1: str) -> None:
    hosts = attach_to_workers(workers=[addr0, addr1], ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    pids = procs.spawn("where", Where).where.call().get(timeout=30).values()
    parents = []  # each proc's parent: its worker's zygote, a child of the worker
    for v in pids:
        stat = Path(f"/proc/{v['ppid']}/stat").read_text()
        cmdline = Path(f"/proc/{v['ppid']}/cmdline").read_bytes().replace(b"\0", b" ")
        parents.append([int(stat.rpartition(")")[2].split()[1]), cmdline.decode()])
    emit(
        pids=[v["pid"] for v in pids],
        parents=parents,
        shutdown=outcome(hosts.shutdown(), 30),
    )


def tls(ca: str, key: str, *addrs: str) -> None:
    from pathlib import Path

    from monarch.core import current_runtime

    trust: Final = "trust_all_connections"
    hosts = attach_to_workers(
        workers=list(addrs),
        ca=trust if ca == trust else Path(ca),
        private_key=None if key == "-" else Path(key),
    )
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    started = outcome(procs.initialized, 30)
    if "error" in started:
        emit(initialized=started)
        return
    actors = procs.spawn("where", Where)
    emit(
        controller=current_runtime().address,
        procs=actors.runtime_address.call().get(timeout=30).values(),
        hosts=[v["host"] for v in actors.where.call().get(timeout=30).values()],
    )


def busy(addr: str, seconds: str) -> None:
    hosts = attach_to_workers(workers=[addr], ca="trust_all_connections")
    hog = hosts.spawn_procs(per_host={"gpus": 1}).spawn("hog", Hog)
    emit(warm=outcome(hog.compute.call_one(0.0), 30))
    begun = time.monotonic()  # before the call: outcome's clock starts after it is sent
    busy = outcome(hog.compute.call_one(float(seconds)), 60)
    emit(busy={**busy, "seconds": _since(begun)})


def gateway(gateway_addr: str, addr: str) -> None:
    from monarch.actor import attach
    from monarch.core import current_runtime

    attach(gateway_addr)
    hosts = attach_to_workers(workers=[addr])
    actors = hosts.spawn_procs(per_host={"gpus": 2}).spawn("where", Where)
    values = actors.where.call().get(timeout=60).values()
    emit(
        controller=current_runtime().address,
        procs=actors.runtime_address.call().get(timeout=30).values(),
        hosts=[v["host"] for v in values],
        pids=[v["pid"] for v in values],
    )
    sys.stdin.readline()  # the test has killed the first proc
    emit(
        killed=outcome(actors.slice(gpus=0).where.call_one(), 30),
        survivor=outcome(actors.slice(gpus=1).where.call_one().then(lambda v: v["host"]), 30),
    )


def frozen(addr: str, worker_pid: str, when: str) -> None:
    """The worker frozen (SIGSTOP) until it is declared lost, then stop() of its procs:
    while it is still frozen (``during``), or once it has resumed (``after``)."""
    lost = threading.Event()
    monarch.actor.unhandled_fault_hook = lambda failure: lost.set()
    hosts = attach_to_workers(workers=[addr], ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    pids = [v["pid"] for v in procs.spawn("where", Where).where.call().get(timeout=30).values()]
    os.kill(int(worker_pid), signal.SIGSTOP)
    try:
        if when == "after":
            lost.wait(60)
            os.kill(int(worker_pid), signal.SIGCONT)
        stopped = outcome(procs.stop(), 60)
    finally:
        os.kill(int(worker_pid), signal.SIGCONT)
    emit(pids=pids, lost=lost.is_set(), stop=stopped)


def spawn(addr: str) -> None:
    hosts = attach_to_workers(workers=[addr], ca="trust_all_connections")
    actors = hosts.spawn_procs(per_host={"gpus": 2}).spawn("where", Where)
    emit(spawned=outcome(actors.where.call().then(lambda v: [x["host"] for x in v.values()]), 90))


def flood(addr: str, count: str) -> None:
    """An attacker without the secret: ``count`` connections to ``addr`` that send nothing;
    for each line on stdin, how many of them the listener has closed."""
    host, _, port = addr.removeprefix("tcp://").rpartition(":")
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(int(count))]
    for sock in socks:
        sock.setblocking(False)
    emit(flooding=len(socks))
    for _ in sys.stdin:
        closed = 0
        for sock in socks:
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        emit(closed=closed)


def connections(addr0: str, addr1: str) -> None:
    """Spawn 3 procs on each of two workers and an actor on each proc, make a gathered
    call (a cast tree of fan-out 2), and say which peers this controller is connected to,
    each way, and who its procs are; then stop them."""
    configure(max_cast_fanout=2)
    hosts = attach_to_workers(workers=[addr0, addr1], ca="trust_all_connections")
    procs = hosts.spawn_procs(per_host={"gpus": 3})
    actors = procs.spawn("where", Where)
    addresses = actors.runtime_address.call().get(timeout=60)
    runtime = current_runtime()
    emit(
        procs=sorted(addresses.values()),
        pids=[v["pid"] for v in actors.where.call().get(timeout=60).values()],
        outbound=sorted(runtime._writers),
        inbound=sorted(runtime._inbound),
        dialed=dict(runtime.dialed),
    )
    emit(stop=outcome(procs.stop(), 60))


SCENARIOS: dict[str, Callable[..., None]] = {
    "gateway": gateway,
    "busy": busy,
    "tls": tls,
    "shutdown": shutdown,
    "local": local,
    "wrong-secret": wrong_secret,
    "netns": netns,
    "root-far": root_far,
    "frozen": frozen,
    "spawn": spawn,
    "flood": flood,
    "connections": connections,
}


def note_failure(failure: Any) -> None:
    """Failures are expected here (hosts are killed): note them instead of exiting."""
    print(f"unhandled: {failure}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    monarch.actor.unhandled_fault_hook = note_failure
    configure(heartbeat_interval="200ms", heartbeat_timeout="1500ms")
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
