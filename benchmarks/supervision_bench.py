"""Supervision: how long after a fault the controller's pending call fails (detection latency).

Run with ``hatch run bench:supervision [--quick] [--out PATH]`` (or plain ``python
benchmarks/supervision_bench.py`` with monarch-core and monarch-transport importable). A
controller process (``_supervision_peer.py``) spawns one proc with an actor blocked in a
call; this process injects a fault and notes the time (CLOCK_MONOTONIC, system-wide); the
figure is the time until that pending call raised SupervisionError in the controller. Also
recorded: when the failure reached the controller's ``unhandled_fault_hook``.

Faults, each on a fresh proc (and a fresh ``monarch worker`` where there is one):

* ``proc_sigkill``: SIGKILL of a proc on this host (spawned with ``this_host()``, Unix
  sockets): the target is <= 100 ms (DESIGN.md); upstream 0.7.0 polls every 10 s.
* ``remote_proc_sigkill``: SIGKILL of a proc started by a worker (TCP on 127.0.0.1).
* ``agent_sigkill``: SIGKILL of the worker (the host agent) whose proc is called.
* ``host_sigstop``: SIGSTOP of the worker and its proc (a frozen host): the heartbeat
  deadline.
* with root and iproute2 (iptables for the partitions), in network namespaces (controller
  on h1 = 10.0.0.1, workers on h2 = 10.0.0.2): ``link_down`` (``ip link set eth0 down`` on
  h2), ``partition_reset`` (h2 answers every TCP segment from the network with a reset) and
  ``partition_drop`` (h2 drops everything to and from the network).

Heartbeats default to 200 ms / 1.5 s here (``--heartbeat-interval``, ``--heartbeat-timeout``;
the library defaults are 1 s / 5 s). Repetitions are interleaved across faults. Nothing here
asserts on speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monarch.core.lowlevel import process_alive
from monarch.core.testing import Child

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import (
    RESULTS_DIR,
    fmt_num,
    machine_info,
    markdown_table,
    package_versions,
    ratio_entry,
    summarize,
    write_json,
)

HERE = Path(__file__).resolve().parent
PEER = HERE / "_supervision_peer.py"
UPSTREAM_POLL_MS = 10_000.0
"""Upstream 0.7.0 notices a dead proc by polling, every 10 s by default (DESIGN.md)."""
SAME_HOST_TARGET_MS = 100.0


@dataclass(frozen=True)
class Fault:
    label: str
    netns: bool
    """Runs in network namespaces (needs root and iproute2)."""
    firewall: bool = False
    """Needs iptables."""
    target_ms: float | None = None


FAULTS: dict[str, Fault] = {
    "proc_sigkill": Fault("SIGKILL of a proc on this host", False, target_ms=SAME_HOST_TARGET_MS),
    "remote_proc_sigkill": Fault("SIGKILL of a proc of a worker (127.0.0.1)", False),
    "agent_sigkill": Fault("SIGKILL of a worker (host agent)", False),
    "host_sigstop": Fault("SIGSTOP of a worker and its proc", False),
    "link_down": Fault("link down (netns)", True),
    "partition_reset": Fault("partition, TCP reset (netns)", True, firewall=True),
    "partition_drop": Fault("partition, silent drop (netns)", True, firewall=True),
}


# -- processes -------------------------------------------------------------------------------


def wait_gone(pids: list[int], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while any(map(process_alive, pids)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"procs {[p for p in pids if process_alive(p)]} still running")
        time.sleep(0.01)


def in_netns(netns: str | None, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else argv


def run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True)


# -- network namespaces (as shared/infra/netns) --------------------------------------------------


def netns_unavailable() -> str | None:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "network namespaces need root on Linux"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2 (the ip command)"
    return None


@contextlib.contextmanager
def namespaces(prefix: str) -> Iterator[tuple[str, str]]:
    """Hosts h1 (10.0.0.1) and h2 (10.0.0.2) on a bridge of their own; removed on exit."""
    switch, hosts = f"{prefix}sw", [f"{prefix}h1", f"{prefix}h2"]
    made: list[str] = []
    try:
        routes = subprocess.run(
            ["ip", "route", "show", "type", "unreachable"], capture_output=True, text=True
        ).stdout
        if "unreachable 10.0.0.0/24" not in routes:  # stray traffic never leaves the machine
            run(["ip", "route", "add", "unreachable", "10.0.0.0/24"])
        run(["ip", "netns", "add", switch])
        made.append(switch)
        run(["ip", "-n", switch, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", switch, "link", "set", "br0", "up"])
        for i, host in enumerate(hosts, 1):
            run(["ip", "netns", "add", host])
            made.append(host)
            veth, port = f"v{prefix}{i}", f"p{prefix}{i}"
            run(["ip", "link", "add", veth, "type", "veth", "peer", "name", port])
            run(["ip", "link", "set", veth, "netns", host])
            run(["ip", "link", "set", port, "netns", switch])
            run(["ip", "-n", switch, "link", "set", port, "master", "br0"])
            run(["ip", "-n", switch, "link", "set", port, "up"])
            run(["ip", "-n", host, "link", "set", veth, "name", "eth0"])
            run(["ip", "-n", host, "addr", "add", f"10.0.0.{i}/24", "dev", "eth0"])
            run(["ip", "-n", host, "link", "set", "eth0", "up"])
            run(["ip", "-n", host, "link", "set", "lo", "up"])
        yield hosts[0], hosts[1]
    finally:
        for ns in reversed(made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def iptables(host: str, *rule: str) -> None:
    run(["ip", "netns", "exec", host, "iptables", *rule])


def inject(fault: str, host: str) -> Callable[[], None]:
    """Put ``fault`` on namespaced ``host``'s network; returns what heals it."""
    if fault == "link_down":
        run(["ip", "-n", host, "link", "set", "eth0", "down"])
        return lambda: run(["ip", "-n", host, "link", "set", "eth0", "up"])
    if fault == "partition_reset":
        rule = ("INPUT", "-i", "eth0", "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
        iptables(host, "-A", *rule)
        return lambda: iptables(host, "-D", *rule)
    assert fault == "partition_drop"
    iptables(host, "-A", "INPUT", "-i", "eth0", "-j", "DROP")
    iptables(host, "-A", "OUTPUT", "-o", "eth0", "-j", "DROP")

    def heal() -> None:
        iptables(host, "-F", "INPUT")
        iptables(host, "-F", "OUTPUT")

    return heal


# -- one repetition ------------------------------------------------------------------------------


class Bench:
    def __init__(self, interval: str, timeout: str, call_timeout: float) -> None:
        self.interval, self.timeout = interval, timeout
        self.call_timeout = call_timeout
        self.env = {
            **os.environ,
            "MONARCH_JOB_SECRET": secrets.token_hex(32),
            # Workers and their procs use the same heartbeats as the controller.
            "MONARCH_HEARTBEAT_INTERVAL": interval,
            "MONARCH_HEARTBEAT_TIMEOUT": timeout,
        }
        self.peers: dict[str | None, Child] = {}
        self.local_peer: Child | None = None
        self.workers: list[Child] = []
        self.hosts: tuple[str, str] | None = None

    def peer(self, netns: str | None, *, local: bool = False) -> Child:
        """The controller: one for this host's procs, one per namespace for workers."""
        if local:
            if self.local_peer is None:
                argv = [sys.executable, str(PEER), self.interval, self.timeout]
                self.local_peer = Child(argv, self.env, stdin=True)
            return self.local_peer
        if netns not in self.peers:
            argv = in_netns(netns, [sys.executable, str(PEER), self.interval, self.timeout])
            self.peers[netns] = Child(argv, self.env, stdin=True)
        return self.peers[netns]

    def worker(self, listen: str, netns: str | None) -> tuple[Child, str]:
        argv = [sys.executable, "-m", "monarch.core.worker", "--listen", listen]
        worker = Child(in_netns(netns, argv), self.env)
        self.workers.append(worker)
        return worker, worker.line(60)

    def once(self, fault: str) -> dict[str, Any]:
        """One fault on a fresh proc: the latencies (s), the error and its message."""
        spec = FAULTS[fault]
        worker: Child | None = None
        heal: Callable[[], None] | None = None
        if fault == "proc_sigkill":
            peer = self.peer(None, local=True)
            peer.send_line(json.dumps({"workers": []}))
        else:
            if spec.netns:
                assert self.hosts is not None
                controller_ns, worker_ns = self.hosts
                worker, address = self.worker("tcp://10.0.0.2:0", worker_ns)
                peer = self.peer(controller_ns)
            else:
                worker, address = self.worker("tcp://127.0.0.1:0", None)
                peer = self.peer(None)
            peer.send_line(json.dumps({"workers": [address]}))
        armed = peer.json(120)
        if "failed" in armed:
            raise RuntimeError(armed["failed"])
        pids: list[int] = armed["pids"]
        try:
            fault_at = time.monotonic()
            if fault in ("proc_sigkill", "remote_proc_sigkill"):
                os.kill(pids[0], signal.SIGKILL)
            elif fault == "agent_sigkill":
                assert worker is not None
                os.kill(worker.pid, signal.SIGKILL)
            elif fault == "host_sigstop":
                assert worker is not None
                for pid in (worker.pid, *pids):
                    os.kill(pid, signal.SIGSTOP)
            else:
                assert self.hosts is not None
                heal = inject(fault, self.hosts[1])
            injected_at = time.monotonic()
            result = peer.json(self.call_timeout)
        finally:
            if heal is not None:
                heal()
            if worker is not None:
                worker.kill()  # its procs die with it
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_gone(pids)
        return {
            "latency_s": result["at"] - fault_at,
            "hook_latency_s": (None if result["hook_at"] is None else result["hook_at"] - fault_at),
            "inject_s": injected_at - fault_at,
            "error": result["error"],
            "message": result["message"],
        }

    def close(self) -> None:
        for proc in [*self.peers.values(), *([self.local_peer] if self.local_peer else [])]:
            proc.kill()
        for worker in self.workers:
            worker.kill()


# -- the run -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a ~30 s smoke run (3 repetitions)")
    p.add_argument("--reps", type=int, help="repetitions per fault (default 7, --quick 3)")
    p.add_argument("--out", default=str(RESULTS_DIR / "supervision.json"), help="JSON output")
    p.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset")
    p.add_argument("--heartbeat-interval", default="200ms", help="heartbeat period")
    p.add_argument("--heartbeat-timeout", default="1500ms", help="silence that means dead")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a failure")
    return p.parse_args(argv)


def _progress(started: float, text: str) -> None:
    print(f"[{time.perf_counter() - started:6.1f}s] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reps = args.reps or (3 if args.quick else 7)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        sys.exit(f"unknown {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    started = time.perf_counter()
    notes: list[str] = []
    skipped: dict[str, str] = {}
    netns_reason = netns_unavailable()
    for fault in faults:
        spec = FAULTS[fault]
        if spec.netns and netns_reason is not None:
            skipped[fault] = netns_reason
        elif spec.firewall and shutil.which("iptables") is None:
            skipped[fault] = "needs iptables (Debian package iptables)"
    runnable = [f for f in faults if f not in skipped]
    samples: dict[str, list[dict[str, Any]]] = {f: [] for f in runnable}
    errors: dict[str, list[str]] = {}
    bench = Bench(args.heartbeat_interval, args.heartbeat_timeout, args.timeout)
    with contextlib.ExitStack() as stack:
        stack.callback(bench.close)
        if any(FAULTS[f].netns for f in runnable):
            try:
                bench.hosts = stack.enter_context(namespaces(f"sb{os.getpid() % 100000}"))
            except subprocess.CalledProcessError as exc:
                reason = f"cannot make network namespaces: {exc.stderr!r}"
                for fault in [f for f in runnable if FAULTS[f].netns]:
                    skipped[fault] = reason
                    runnable.remove(fault)
        for rep in range(reps):
            _progress(started, f"repetition {rep + 1}/{reps}")
            order = runnable[rep % len(runnable) :] + runnable[: rep % len(runnable)]
            for fault in order:
                try:
                    samples[fault].append(bench.once(fault))
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    errors.setdefault(fault, []).append(f"{type(exc).__name__}: {exc}")
    for fault, reason in skipped.items():
        notes.append(f"{fault} skipped: {reason}")

    figures = []
    targets = []
    for fault in runnable:
        got = samples[fault]
        ms = [s["latency_s"] * 1000 for s in got if s["error"] == "SupervisionError"]
        hook_ms = [s["hook_latency_s"] * 1000 for s in got if s["hook_latency_s"] is not None]
        wrong = [s for s in got if s["error"] != "SupervisionError"]
        for s in wrong:
            errors.setdefault(fault, []).append(f"pending call ended: {s['error']}: {s['message']}")
        figure = {
            "name": fault,
            "label": FAULTS[fault].label,
            "unit": "ms",
            **summarize(ms),
            "hook_ms": summarize(hook_ms),
            "inject_ms": summarize([s["inject_s"] * 1000 for s in got]),
            "messages": sorted({s["message"] for s in got}),
        }
        figures.append(figure)
        target = FAULTS[fault].target_ms
        if target is not None:
            targets.append(
                ratio_entry(
                    f"{fault}_median_ms",
                    1.0,
                    figure["median"],
                    target,
                    higher_is_better=False,
                    against=f"target {target:g} ms",
                )
            )
        targets.append(
            ratio_entry(
                f"{fault}_median_ms",
                1.0,
                figure["median"],
                UPSTREAM_POLL_MS,
                higher_is_better=False,
                against="upstream 0.7.0 default poll (10 s)",
            )
        )
    info = machine_info()
    info["load_average_end"] = info.pop("load_average", None)
    doc = {
        "benchmark": "supervision",
        "machine": info,
        "packages": package_versions(["monarch-core", "monarch-transport", "uvloop"]),
        "settings": {
            "reps": reps,
            "faults": faults,
            "heartbeat_interval": args.heartbeat_interval,
            "heartbeat_timeout": args.heartbeat_timeout,
            "quick": args.quick,
        },
        "duration_s": round(time.perf_counter() - started, 1),
        "upstream": {"version": "0.7.0", "supervision_poll_ms": UPSTREAM_POLL_MS},
        "figures": figures,
        "targets": targets,
        "errors": errors,
        "notes": notes,
    }
    out_path = write_json(args.out, doc)
    print(render_markdown(doc))
    print(f"\nJSON written to {out_path}", file=sys.stderr)
    return 0


def _span(f: dict[str, Any]) -> str:
    if f["median"] is None:
        return "-"
    return f"{fmt_num(f['min'])}-{fmt_num(f['max'])}"


def render_markdown(doc: dict[str, Any]) -> str:
    m, s = doc["machine"], doc["settings"]
    lines = [
        f"## Supervision: detection latency ({m.get('cpu_count')} CPUs, "
        f"{m.get('cpu_model', '?')}, Python {m.get('python')}, load "
        f"{m.get('load_average_end')}, {doc['duration_s']} s)",
        "",
        f"From the fault to the pending call's SupervisionError at the controller; median of "
        f"{s['reps']} repetitions, min-max, and ± half that range relative to the median. "
        f"Heartbeats every {s['heartbeat_interval']}, deadline {s['heartbeat_timeout']}. "
        f"'hook': when the failure reached unhandled_fault_hook. Upstream 0.7.0 notices a "
        f"dead proc by polling every 10 s by default.",
        "",
    ]
    goals = {t["name"]: t for t in doc["targets"] if not t["against"].startswith("upstream")}
    vs_upstream = {t["name"]: t for t in doc["targets"] if t["against"].startswith("upstream")}
    rows = []
    for f in doc["figures"]:
        name = f"{f['name']}_median_ms"
        goal, up = goals.get(name), vs_upstream.get(name)
        spread = f" ±{f['spread'] * 100:.0f}%" if f["spread"] is not None else ""
        rows.append(
            [
                f["label"],
                fmt_num(f["median"]) + spread if f["median"] is not None else "-",
                _span(f),
                fmt_num(f["hook_ms"]["median"]),
                len(f["reps"]),
                fmt_num(UPSTREAM_POLL_MS),
                fmt_num(up["ratio"]) if up else "-",
                f"<= {fmt_num(goal['baseline'])} ms" if goal else "",
                {True: "pass", False: "FAIL", None: "-"}[goal["pass"]] if goal else "",
            ]
        )
    headers = [
        "fault",
        "median ms",
        "min-max ms",
        "hook ms",
        "n",
        "upstream ms (poll)",
        "vs upstream",
        "target",
        "result",
    ]
    lines.append(markdown_table(headers, rows))
    lines.append("")
    for f in doc["figures"]:  # what the controller was told, for each kind of fault
        lines.append(f"- {f['name']}: {f['messages'][0][:200] if f['messages'] else '-'}")
    for fault, errs in doc["errors"].items():
        lines.append(f"- errors in {fault}: {len(errs)} (first: {errs[0]})")
    for note in doc["notes"]:
        lines.append(f"- {note}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
