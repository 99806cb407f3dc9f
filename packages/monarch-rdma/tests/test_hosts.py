"""Buffers between two hosts: network namespaces (as shared/infra/netns), a ``monarch
worker`` on one, the controller on the other; the bytes go over the TCP plane."""

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

CONTROLLER = Path(__file__).with_name("rdma_hosts_controller.py")


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str]]:
    """Namespaces at 10.0.0.1 and 10.0.0.2, joined by a veth pair."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"rd{os.getpid() % 100000}"
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


def test_a_buffer_on_another_host_is_read_and_written_over_tcp(two_hosts: tuple[str, str]) -> None:
    a, b = two_hosts
    env = {**os.environ, "MONARCH_JOB_SECRET": secrets.token_hex(32)}
    worker = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            b,
            sys.executable,
            "-m",
            "monarch.core._cli",
            "worker",
            "--listen",
            "tcp://10.0.0.2:0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        address = worker.stdout.readline().strip()  # the worker prints its address first
        assert address.startswith("tcp://10.0.0.2:"), (address, worker.stderr)
        done = subprocess.run(
            ["ip", "netns", "exec", a, sys.executable, str(CONTROLLER), address],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result == {"plane": "tcp", "owner_host": "10.0.0.2", "read": True, "written": True}
    finally:
        worker.kill()
        worker.wait(30)
