"""Distributed tensors across machines: two network namespaces (the repository conftest's
``two_hosts``), a ``monarch worker`` on each, the controller on the first; collectives run by
gloo between the hosts, not through loopback."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CONTROLLER = Path(__file__).with_name("tensor_hosts_controller.py")


def test_collectives_run_between_hosts(
    two_hosts: tuple[str, str], netns_worker: Callable[[str, str, dict[str, str]], str]
) -> None:
    a, b = two_hosts
    env = {**os.environ, "MONARCH_JOB_SECRET": secrets.token_hex(32)}
    addresses = [netns_worker(a, "10.0.0.1", env), netns_worker(b, "10.0.0.2", env)]
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
