"""A job over many namespace hosts, as a user runs one, with its faults: what
test_many_hosts.py checks at 8 hosts and benchmarks/hosts_bench.py measures at 32.

Host ``{prefix}h1`` (10.0.0.1) runs the controller (``hosts_controller.py``); hosts
``h2..`` each run one ``monarch worker`` on ``tls://10.0.0.K:26600`` with a certificate
from ``monarch tls init`` / ``monarch tls issue`` and the job secret in a 0600 file; the
controller gets the secret in its environment. ``scenario`` then drives, in order:

attach and spawn; gathered calls; the controller's connections, those that carry traffic
and its packets per second (idle, and with casts flowing); its messages per gathered call,
and round trips to one actor; host 1 killed (every process in
its namespace, SIGKILL) during a gathered call; host 5's first proc killed (SIGKILL, its
agent alive) during one; host 2 partitioned (iptables DROP both ways) during one, healed
later; host 3's first proc frozen (SIGSTOP) past the heartbeat deadline, then resumed;
host 4's worker frozen likewise, then resumed; and ``stop()``. Casts keep flowing to the
hosts still in the job throughout. Every wait polls a condition against a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostkit import (
    SECRET_ENV,
    children,
    ip,
    network_namespaces,
    silent_partition,
    worker_argv,
)

from monarch.core._host._zygote_proc import TITLE as ZYGOTE_TITLE
from monarch.core.testing import Child, alive, wait_until

CONTROLLER = Path(__file__).with_name("hosts_controller.py")
PORT = 26600
KILLED, PARTITIONED, FROZEN_PROC, FROZEN_WORKER, ONE_KILLED = 1, 2, 3, 4, 5
"""The mesh's host that each fault hits (host 0 holds the owner actor: never hit)."""
MIN_HOSTS = 6


def cli(*args: str, cwd: Path) -> None:
    argv = [sys.executable, "-m", "monarch.core._command._cli", *args]
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True, timeout=120)


def netns_pids(ns: str) -> set[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return {int(p) for p in done.stdout.split()}


def is_zygote(pid: int) -> bool:
    """A worker's forker of procs (it stays with the worker, as the worker does)."""
    try:
        return ZYGOTE_TITLE in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def ticks_after(folder: Path, pids: list[int], since: float) -> list[float]:
    """Ticks that the procs ``pids`` ran after ``since`` (their files in ``folder``)."""
    found: list[float] = []
    for pid in pids:
        path = folder / str(pid)
        if path.exists():
            found += [t for t in map(float, path.read_text().split()) if t > since]
    return found


def controller_traffic(ns: str, pid: int, seconds: float) -> dict[str, Any]:
    """The controller's TCP connections (``ss``) and the packets per second its host sent
    and received over ``seconds`` (it is the host's only process). ``busy_connections``:
    those that still carried traffic after the first third of the time (heartbeats, when
    idle; the last ACKs of calls just made land in the first third); ``active_connections``:
    those that carried any."""

    def packets() -> tuple[int, int]:
        stats = json.loads(ip("-n", ns, "-s", "-j", "link", "show", "eth0"))[0]["stats64"]
        return int(stats["rx"]["packets"]), int(stats["tx"]["packets"])

    first = segments(ns, pid)
    rx0, tx0 = packets()
    start = time.monotonic()
    settled: dict[tuple[str, str], int] = {}
    for until, snapshot in ((seconds / 3, True), (seconds, False)):
        while time.monotonic() < start + until:
            time.sleep(min(0.2, max(start + until - time.monotonic(), 0)))
        if snapshot:
            settled = segments(ns, pid)
    rx1, tx1 = packets()
    took = time.monotonic() - start
    last = segments(ns, pid)
    return {
        "connections": len(last),
        "busy_connections": sum(settled[c] != n for c, n in last.items() if c in settled),
        "active_connections": sum(first[c] != n for c, n in last.items() if c in first),
        "rx_pps": (rx1 - rx0) / took,
        "tx_pps": (tx1 - tx0) / took,
    }


def connection_states(ns: str) -> dict[str, int]:
    """TCP sockets in namespace ``ns`` (the controller's: its only process) by state,
    listeners left out."""
    argv = ["ip", "netns", "exec", ns, "ss", "-tanH"]
    lines = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    states: dict[str, int] = {}
    for line in lines:
        state = line.split()[0]
        if state != "LISTEN":
            states[state] = states.get(state, 0) + 1
    return states


def link_bytes(ns: str) -> int:
    """Bytes in and out of ``ns``'s interface so far."""
    stats = json.loads(ip("-n", ns, "-s", "-j", "link", "show", "eth0"))[0]["stats64"]
    return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])


def footprint(c: Cluster, *, reps: int = 20, idle_s: float = 5.0) -> dict[str, Any]:
    """The controller's footprint after attach and spawn (issue 34): its connections (by
    state, and its own books), packets, bytes and messages per second idle and with casts
    flowing, its messages per gathered call, and the latency of a round trip to one actor
    and of a gathered call; then ``stop()``. No faults."""
    timeout = seconds_setting(c.env, "MONARCH_HEARTBEAT_TIMEOUT")
    out: dict[str, Any] = {"hosts": c.hosts, "per_host": c.per_host, "procs": c.hosts * c.per_host}
    ready = c.launch(timeout=max(300, timeout))
    out["attach_s"], out["spawn_s"] = ready["attach_s"], ready["spawn_s"]
    ctl_pid, ns = int(ready["controller_pid"]), c.namespaces[0]
    out["calls"] = c.do("calls", reps=3)
    out["after_spawn"] = {"states": connection_states(ns), "books": c.do("counters")}
    out["latency"] = c.do("latency", reps=reps)
    for key, flowing in (("idle", False), ("flowing", True)):
        c.do("flow", on=flowing)
        before, bytes0 = c.do("counters"), link_bytes(ns)
        traffic = controller_traffic(ns, ctl_pid, idle_s)
        after, bytes1 = c.do("counters"), link_bytes(ns)
        took = after["now"] - before["now"]
        traffic["bytes_ps"] = (bytes1 - bytes0) / took
        traffic["sent_ps"] = (after["posted"] - before["posted"]) / took
        traffic["received_ps"] = (after["received"] - before["received"]) / took
        traffic["states"] = connection_states(ns)
        traffic["books"] = after
        out[key] = traffic
    out["flow"] = c.do("flow", on=False)
    out["stop"] = c.do("stop", timeout=150, within=120)
    everyone = [pid for host in range(c.hosts) for pid in c.pids(host)]
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not any(map(alive, everyone)), 10, "every proc gone")
    out["left_after"] = sorted(p for p in everyone if alive(p))
    return out


def segments(ns: str, pid: int) -> dict[tuple[str, str], int]:
    """Segments in and out of each of ``pid``'s established TCP connections (``ss -ti``),
    by its two ends: which connections carry traffic (heartbeats, when idle)."""
    argv = ["ip", "netns", "exec", ns, "ss", "-tinpH", "state", "established"]
    lines = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.splitlines()
    out: dict[tuple[str, str], int] = {}
    for head, info in zip(lines[::2], lines[1::2], strict=False):
        if f"pid={pid}," in head:
            ends = head.split()[2:4]
            counts = re.findall(r"\bsegs_(?:in|out):(\d+)", info)
            out[(ends[0], ends[1])] = sum(map(int, counts))
    return out


@dataclass
class Cluster:
    """The namespaces, the workers and the controller of one job."""

    hosts: int
    per_host: int
    folder: Path
    start: Callable[..., Child]
    namespaces: list[str]
    env: dict[str, str]
    workers: list[Child] = field(default_factory=list)
    controller: Child | None = None
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def ticks(self) -> Path:
        return self.folder / "ticks"

    def ns(self, host: int) -> str:
        """The namespace of the mesh's ``host`` (the controller's is namespaces[0])."""
        return self.namespaces[host + 1]

    def launch(self, timeout: float) -> dict[str, Any]:
        """TLS material, the workers and the controller; what the controller said once up."""
        folder = self.folder
        cli("tls", "init", "--dir", str(folder), cwd=folder)
        names = [f"10.0.0.{i}" for i in range(1, self.hosts + 2)]
        cli("tls", "issue", *names, "--dir", str(folder), cwd=folder)
        secret = folder / "job.secret"
        secret.write_text(self.env[SECRET_ENV] + "\n")
        secret.chmod(0o600)
        worker_env = {k: v for k, v in self.env.items() if k != SECRET_ENV}
        for host in range(self.hosts):
            listen = f"tls://10.0.0.{host + 2}:{PORT}"
            pem = folder / f"10.0.0.{host + 2}.pem"
            argv = worker_argv(listen, "--secret-file", str(secret), "--ca", str(folder / "ca.pem"))
            argv += ["--private-key", str(pem)]
            self.workers.append(
                self.start(["ip", "netns", "exec", self.ns(host), *argv], worker_env)
            )
        addresses = [w.line(timeout) for w in self.workers]
        self.ticks.mkdir()
        argv = [
            sys.executable,
            str(CONTROLLER),
            str(folder / "ca.pem"),
            str(folder / "10.0.0.1.pem"),
        ]
        argv += [str(self.per_host), str(self.ticks), *addresses]
        self.controller = self.start(
            ["ip", "netns", "exec", self.namespaces[0], *argv], self.env, stdin=True
        )
        try:
            self.ready = self.controller.json(timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.workers_said()}") from None
        return self.ready

    def workers_said(self) -> str:
        """The end of each worker's stderr, for a failure's message."""
        return "\n".join(
            f"worker {i} ({'running' if w.popen.poll() is None else w.popen.poll()}): "
            f"{w.said()[-1500:]}"
            for i, w in enumerate(self.workers)
            if w.said().strip()
        )

    def do(self, command: str, timeout: float = 120, **args: Any) -> dict[str, Any]:
        assert self.controller is not None
        self.controller.send_line(json.dumps({"do": command, **args}))
        return self.controller.json(timeout)

    def pids(self, host: int) -> list[int]:
        pids: list[int] = self.ready["pids"][host]
        return pids

    def strays(self) -> dict[str, list[int]]:
        """Processes left in the workers' namespaces besides the workers themselves."""
        left: dict[str, list[int]] = {}
        for host, worker in enumerate(self.workers):
            others = netns_pids(self.ns(host)) - {worker.pid}  # ip netns exec execs it
            others = {p for p in others if not is_zygote(p)}
            if others:
                left[self.ns(host)] = sorted(others)
        return left


@contextlib.contextmanager
def cluster(hosts: int, per_host: int, env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """``hosts`` worker namespaces and the controller's, torn down (every process killed)
    on exit. Heartbeats 200 ms / 1.5 s unless ``env`` says otherwise."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    base.update({"MONARCH_HEARTBEAT_INTERVAL": "200ms", "MONARCH_HEARTBEAT_TIMEOUT": "1500ms"})
    base[SECRET_ENV] = secrets.token_hex(32)
    base.update(env or {})
    prefix = f"mh{os.getpid() % 100000}"
    with (
        tempfile.TemporaryDirectory(prefix="many-hosts-") as tmp,
        network_namespaces(hosts + 1, prefix) as namespaces,
        children() as start,
    ):
        yield Cluster(hosts, per_host, Path(tmp), start, namespaces, base)


def seconds_setting(env: dict[str, str], name: str) -> float:
    value = env[name]
    return float(value[:-2]) / 1000 if value.endswith("ms") else float(value.rstrip("s"))


def scenario(c: Cluster, *, reps: int = 5, traffic_s: float = 3.0) -> dict[str, Any]:
    """Everything in the module docstring, in order; what was seen, as JSON-able data."""
    if c.hosts < MIN_HOSTS:
        raise ValueError(f"the scenario needs at least {MIN_HOSTS} hosts, not {c.hosts}")
    timeout = seconds_setting(c.env, "MONARCH_HEARTBEAT_TIMEOUT")
    out: dict[str, Any] = {"hosts": c.hosts, "per_host": c.per_host, "procs": c.hosts * c.per_host}
    started = time.monotonic()
    ready = c.launch(timeout=300)
    out["launch_s"] = time.monotonic() - started
    out["attach_s"], out["spawn_s"] = ready["attach_s"], ready["spawn_s"]
    ctl_pid = int(ready["controller_pid"])
    out["calls"] = c.do("calls", reps=reps)
    out["traffic_idle"] = controller_traffic(c.namespaces[0], ctl_pid, traffic_s)
    c.do("flow", on=True)
    out["traffic_flowing"] = controller_traffic(c.namespaces[0], ctl_pid, traffic_s)
    # After the counts above: it calls one actor per host (a connection each way to each);
    # the flow paused, so that only its own calls are counted.
    c.do("flow", on=False)
    out["latency"] = c.do("latency", reps=reps)
    c.do("flow", on=True)

    # A host killed while a gathered call is in flight.
    c.do("pending", seconds=3.0)
    victims = netns_pids(c.ns(KILLED))
    fault_at = time.monotonic()
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = c.do("fault", host=KILLED, within=60)
    out["killed"] = fault_report(c, killed, fault_at, KILLED)

    # One proc SIGKILLed during a gathered call, its host and agent alive: the agent,
    # which watches it for the controller, and its closed connections report it.
    c.do("pending", seconds=3.0)
    fault_at = time.monotonic()
    os.kill(c.pids(ONE_KILLED)[0], signal.SIGKILL)
    one = c.do("fault", host=ONE_KILLED, within=60)
    out["proc_killed"] = fault_report(c, one, fault_at, ONE_KILLED)

    # A host partitioned (packets dropped) while a gathered call is in flight.
    c.do("pending", seconds=3.0 + timeout)
    fault_at = time.monotonic()
    heal = silent_partition(c.ns(PARTITIONED))
    parted = c.do("fault", host=PARTITIONED, within=60)
    out["partitioned"] = fault_report(c, parted, fault_at, PARTITIONED)

    # Fencing: a frozen proc, a frozen worker and the partition that heals, casts flowing.
    out["fencing"] = {
        "frozen_proc": fence(c, FROZEN_PROC, [c.pids(FROZEN_PROC)[0]], timeout, proc=True),
        "frozen_worker": fence(c, FROZEN_WORKER, [c.workers[FROZEN_WORKER].pid], timeout),
        "partition_heals": healed(c, heal, out["partitioned"], timeout),
    }
    out["flow"] = c.do("flow", on=False)
    out["calls_after"] = c.do("calls", reps=reps)

    out["stop"] = c.do("stop", timeout=150, within=120)
    everyone = [pid for host in range(c.hosts) for pid in c.pids(host)]
    out["left_at_stop"] = sorted(p for p in everyone if alive(p))
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not any(map(alive, everyone)), 10, "every proc gone")
    out["left_after"] = sorted(p for p in everyone if alive(p))
    out["strays"] = c.strays()
    out["workers_alive"] = sum(w.popen.poll() is None for w in c.workers)
    return out


def fault_report(c: Cluster, seen: dict[str, Any], fault_at: float, host: int) -> dict[str, Any]:
    """When the pending call failed, and when the client's hook and the owner heard of
    ``host``'s ranks, each after ``fault_at`` (s); whether the other hosts answered."""
    ranks = set(range(host * c.per_host, (host + 1) * c.per_host))

    def first(failures: list[dict[str, Any]]) -> float | None:
        times = [f["at"] for f in failures if ranks & set(f["ranks"]) and f["at"] >= fault_at]
        return min(times) - fault_at if times else None

    pending, owner = seen["pending"], seen["owner_failures"]
    answered = [s.get("value") == [1] * len(s.get("value") or ()) for s in seen["survivors"]]
    return {
        "pending_error": pending.get("error"),
        "pending_message": pending.get("message"),
        "pending_s": pending["at"] - fault_at if "error" in pending else None,
        "client_s": first(seen["client_failures"]),
        "owner_s": first(owner) if isinstance(owner, list) else None,
        "owner_seen": owner,
        "others_answered": all(answered) and bool(answered),
        "declared_at": pending["at"] if "error" in pending else None,
        "fault_at": fault_at,
    }


def fence(
    c: Cluster, host: int, frozen: list[int], timeout: float, *, proc: bool = False
) -> dict[str, Any]:
    """Freeze ``frozen`` (pids on ``host``: its procs if ``proc``, else its worker) past the
    heartbeat deadline, resume them, and see what the job and the procs written off do."""
    procs = frozen if proc else c.pids(host)
    before = c.do("status")
    fault_at = time.monotonic()
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    ranks = set(range(host * c.per_host, (host + 1) * c.per_host))

    def declared() -> float | None:
        seen = c.do("status")["client_failures"][len(before["client_failures"]) :]
        times = [f["at"] for f in seen if ranks & set(f["ranks"])]
        return min(times) if times else None

    with contextlib.suppress(AssertionError):
        wait_until(lambda: declared() is not None, timeout + 10, f"host {host} written off")
    declared_at = declared()
    c.do("leave", host=host)
    last(fault_at + 2 * timeout)  # past the deadline by as long again
    resumed_at = time.monotonic()
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):  # fenced already: killed while frozen
            os.kill(pid, signal.SIGCONT)
    return after_resume(c, host, procs, fault_at, declared_at, resumed_at, timeout)


def healed(
    c: Cluster, heal: Callable[[], None], parted: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """The partition (``parted``: its report) heals once it has lasted the heartbeat
    deadline twice over."""
    fault_at, declared_at = parted["fault_at"], parted["declared_at"]
    last(fault_at + 2 * timeout)
    procs = c.pids(PARTITIONED)
    gone_before = not any(map(alive, procs))
    resumed_at = time.monotonic()
    heal()
    return {"gone_before_heal": gone_before} | after_resume(
        c, PARTITIONED, procs, fault_at, declared_at, resumed_at, timeout
    )


def last(until: float) -> None:
    """A fault lasts until ``until`` (monotonic): its length is what is tested."""
    time.sleep(max(until - time.monotonic(), 0))


def after_resume(
    c: Cluster,
    host: int,
    procs: list[int],
    fault_at: float,
    declared_at: float | None,
    resumed_at: float,
    timeout: float,
) -> dict[str, Any]:
    """Whether ``host``'s procs are gone (and how soon after resuming), whether any ran a
    tick after being written off, and whether the other hosts still answer."""
    try:
        gone_s: float | None = wait_until(
            lambda: not any(map(alive, procs)), timeout + 5, f"host {host}'s procs gone"
        )
    except AssertionError:
        gone_s = None
    status = c.do("status")
    written_off = declared_at if declared_at is not None else resumed_at
    late = ticks_after(c.ticks, procs, written_off)
    worker = c.workers[host]
    return {
        "declared_s": declared_at - fault_at if declared_at is not None else None,
        "procs_gone_s": gone_s,
        "alive_after": sorted(p for p in procs if alive(p)),
        "ticks_after_written_off": len(late),
        "ticks_after_resume": len([t for t in late if t > resumed_at]),
        "worker_alive": worker.popen.poll() is None,
        "client_failures": len(status["client_failures"]),
    }
