"""Helpers of the jobs tests: a user's script run as a process, pids, waiting on conditions.

Nothing here sleeps for a fixed time: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("job_script.py")


class Script:
    """Runs job_script.py in one folder (where the job's state is saved), as a user would;
    ``prefix`` runs it under another command (``ip netns exec h1``)."""

    def __init__(
        self, folder: Path, prefix: Sequence[str] = (), env: Mapping[str, str] | None = None
    ) -> None:
        self.folder = folder
        self.prefix = list(prefix)
        self.env = {**os.environ, **(env or {})}

    def run(self, *args: str, pass_fds: Sequence[int] = ()) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, sys.executable, str(SCRIPT), *args],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            pass_fds=pass_fds,
        )

    def __call__(self, *args: str) -> tuple[dict[str, Any], str]:
        done = self.run(*args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


# -- hosts in network namespaces, each with a real sshd (tools/ssh) ---------------------------

START_SSHD = Path(__file__).parents[3] / "tools" / "ssh" / "start.sh"
SSH_KEY = "/etc/ssh/monarch-test/id_ci"
SSH_ARGS = [
    "-i",
    SSH_KEY,
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ConnectTimeout=10",
]
"""How the tests' clients log in to the test sshd (as root, with the key start.sh made)."""


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


HOSTS = Path(__file__).parents[3] / "tools" / "netns" / "hosts.sh"


def make_hosts(count: int, prefix: str) -> list[str]:
    """Namespaces ``{prefix}h1..`` at 10.0.0.1../24 on a bridge of their own
    (tools/netns/hosts.sh; the prefix keeps concurrent runs apart). ``drop_hosts`` undoes it."""
    done = subprocess.run(
        ["bash", str(HOSTS), "up", prefix, str(count)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"network namespaces {prefix}h1..: {done.stderr.strip()}")
    return done.stdout.split()


def drop_hosts(prefix: str) -> None:
    """Kill every process left in the ``{prefix}`` namespaces and delete them."""
    subprocess.run(["bash", str(HOSTS), "down", prefix], capture_output=True)


def netns_of(host: str) -> str:
    """The network namespace of ``host`` (as ``/proc/PID/ns/net`` names it)."""
    done = subprocess.run(
        ["ip", "netns", "exec", host, "readlink", "/proc/self/ns/net"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def start_sshd(host: str, address: str, pidfile: str) -> None:
    """A real sshd listening at ``address`` in namespace ``host`` (tools/ssh/start.sh)."""
    done = subprocess.run(
        ["bash", str(START_SSHD), address, pidfile, host], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"sshd did not start in {host}: {done.stderr}")


class Terminal:
    """A process on a pseudo-terminal of its own, read with deadlines."""

    def __init__(self, argv: list[str], cwd: Path | None = None) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, start_new_session=True
        )
        os.close(slave)
        self.seen = b""

    def until(self, marker: bytes, timeout: float = 60) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not within {timeout}s: {marker!r} in {self.seen[-2000:]!r}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the process ended and closed the terminal
                    raise AssertionError(f"{marker!r} never came: {self.seen[-2000:]!r}") from None
        return self.seen

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        os.close(self.master)
