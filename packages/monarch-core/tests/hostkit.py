"""Helpers for tests over real processes and "hosts": children, pids, network namespaces.

Shared by test_remote_hosts.py and test_faults.py (imported by name: conftest.py puts this
folder on ``sys.path``). Nothing here sleeps for a fixed time: every wait polls a condition
against a deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

from monarch.core.testing import Child

SECRET_ENV = "MONARCH_JOB_SECRET"


@contextlib.contextmanager
def children() -> Iterator[Callable[..., Child]]:
    """``start(argv, env, stdin=False)`` starts a Child; all are killed on exit."""
    started: list[Child] = []

    def start(argv: list[str], env: dict[str, str], *, stdin: bool = False) -> Child:
        child = Child(argv, env, stdin=stdin)
        started.append(child)
        return child

    try:
        yield start
    finally:
        for child in reversed(started):
            if child.popen.poll() is None:  # a frozen child must be able to die
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGCONT)
            child.kill()


def worker_argv(listen: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "monarch.core._command._cli",
        "worker",
        "--listen",
        listen,
        *extra,
    ]


def gateway_argv(listen: str) -> list[str]:
    return [sys.executable, "-m", "monarch.core._command._cli", "gateway", "--listen", listen]


def start_worker(
    start: Callable[..., Child], env: dict[str, str], listen: str, netns: str | None = None
) -> tuple[Child, str]:
    """A ``monarch worker`` (in namespace ``netns`` if given), and the address it printed."""
    prefix = ["ip", "netns", "exec", netns] if netns else []
    child = start([*prefix, *worker_argv(listen)], env)
    return child, child.line(30)


# -- processes -------------------------------------------------------------------------------


def socket_queued(pid: int) -> int:
    """Bytes waiting in the receive queues of ``pid``'s Unix and TCP sockets (``ss``)."""
    done = subprocess.run(["ss", "-xtpnH"], capture_output=True, text=True, check=True)
    needle = f"pid={pid},"
    total = 0
    for line in done.stdout.splitlines():
        if needle in line:
            fields = line.split()
            with contextlib.suppress(IndexError, ValueError):
                total += int(fields[2])  # netid state Recv-Q Send-Q ...
    return total


# -- hosts in network namespaces (as shared/infra/netns) --------------------------------------


def ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def netns_unavailable() -> str | None:
    """Why namespaced hosts cannot be made here, or None if they can."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "network namespaces need root on Linux"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2 (the ip command)"
    return None


def iptables(host: str, *rule: str) -> None:
    """Add or remove a firewall ``rule`` in namespace ``host``."""
    argv = ["ip", "netns", "exec", host, "iptables", *rule]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, f"iptables {' '.join(rule)} in {host}: {done.stderr}"


def silent_partition(host: str) -> Callable[[], None]:
    """Drop every packet to and from ``host``'s network (no reset, no refusal); returns
    what heals it."""
    iptables(host, "-A", "INPUT", "-i", "eth0", "-j", "DROP")
    iptables(host, "-A", "OUTPUT", "-o", "eth0", "-j", "DROP")

    def heal() -> None:
        iptables(host, "-F", "INPUT")
        iptables(host, "-F", "OUTPUT")

    return heal


class NetnsUnavailable(RuntimeError):
    """Namespaces could not be made on this machine (a reason to skip, not a failure)."""


@contextlib.contextmanager
def network_namespaces(count: int, prefix: str) -> Iterator[list[str]]:
    """Namespaces ``{prefix}h1..`` at 10.0.0.1../24 on a bridge of their own.

    ``prefix`` keeps concurrent users apart (pass something unique, e.g. with the pid). On
    exit every process left in them is killed and they are deleted.
    """
    reason = netns_unavailable()
    if reason is not None:
        raise NetnsUnavailable(reason)
    switch = f"{prefix}sw"
    hosts = [f"{prefix}h{i}" for i in range(1, count + 1)]
    made: list[str] = []
    try:
        # Guard: the root namespace must never route 10.0.0.0/24 anywhere, so that a stray
        # connect from outside the namespaces fails here instead of leaving the machine.
        if "unreachable 10.0.0.0/24" not in ip("route", "show", "type", "unreachable"):
            try:
                ip("route", "add", "unreachable", "10.0.0.0/24")
            except RuntimeError as exc:
                raise NetnsUnavailable(
                    f"cannot install the guard route (10.0.0.0/24 in use here?): {exc}"
                ) from None
        try:
            ip("netns", "add", switch)
        except RuntimeError as exc:
            raise NetnsUnavailable(f"cannot create network namespaces: {exc}") from None
        made.append(switch)
        ip("-n", switch, "link", "add", "br0", "type", "bridge")
        ip("-n", switch, "link", "set", "br0", "up")
        for i, host in enumerate(hosts, 1):
            ip("netns", "add", host)
            made.append(host)
            veth, port = f"v{prefix}{i}", f"p{prefix}{i}"
            ip("link", "add", veth, "type", "veth", "peer", "name", port)
            ip("link", "set", veth, "netns", host)
            ip("link", "set", port, "netns", switch)
            ip("-n", switch, "link", "set", port, "master", "br0")
            ip("-n", switch, "link", "set", port, "up")
            ip("-n", host, "link", "set", veth, "name", "eth0")
            ip("-n", host, "addr", "add", f"10.0.0.{i}/24", "dev", "eth0")
            ip("-n", host, "link", "set", "eth0", "up")
            ip("-n", host, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns in reversed(made):
            for pid in subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True
            ).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
