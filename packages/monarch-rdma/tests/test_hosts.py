"""Buffers between two hosts: network namespaces (the repository conftest's ``two_hosts``),
a ``monarch worker`` on one, the controller on the other; the bytes go over the TCP plane."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CONTROLLER = Path(__file__).with_name("rdma_hosts_controller.py")


def test_a_buffer_on_another_host_is_read_and_written_over_tcp(
    two_hosts: tuple[str, str], netns_worker: Callable[[str, str, dict[str, str]], str]
) -> None:
    a, b = two_hosts
    env = {**os.environ, "MONARCH_JOB_SECRET": secrets.token_hex(32)}
    address = netns_worker(b, "10.0.0.2", env)
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
