"""Distributed tensors across machines: two network namespaces (as shared/infra/netns), a
``monarch worker`` on each, the controller on the first; collectives run by gloo between
the hosts, not through loopback."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

CONTROLLER = Path(__file__).with_name("tensor_hosts_controller.py")


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str]]:
    """Namespaces at 10.0.0.1 and 10.0.0.2, joined by a veth pair."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"te{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    made: list[str] = []
    try:
        for ns in (a, b):
            ip("netns", "add", ns)
            made.append(ns)
        ip("link", "add", f"{tag}x", "type", "veth", "peer", "name", f"{tag}y")
        for ns, end, addr in ((a, f"{tag}x", "10.0.0.1/24"), (b, f"{tag}y", "10.0.0.2/24")):
            ip("link", "set", end, "netns", ns)
            ip("-n", ns, "addr", "add", addr, "dev", end)
            ip("-n", ns, "link", "set", end, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def start_worker(ns: str, host: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    worker = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "monarch.core._cli", "worker",
         "--listen", f"tcp://{host}:0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert worker.stdout is not None
    address = worker.stdout.readline().strip()  # the worker prints its address first
    assert address.startswith(f"tcp://{host}:"), address
    return worker, address


def test_collectives_run_between_hosts(two_hosts: tuple[str, str]) -> None:
    a, b = two_hosts
    env = {**os.environ, "MONARCH_JOB_SECRET": secrets.token_hex(32)}
    workers: list[subprocess.Popen[str]] = []
    try:
        addresses = []
        for ns, host in ((a, "10.0.0.1"), (b, "10.0.0.2")):
            worker, address = start_worker(ns, host, env)
            workers.append(worker)
            addresses.append(address)
        done = subprocess.run(
            ["ip", "netns", "exec", a, sys.executable, str(CONTROLLER), *addresses],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result == {"summed": [3.0, 3.0], "maxed": [2.0, 2.0]}
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(30)
