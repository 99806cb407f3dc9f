"""The system daemons the test suite starts, and stopping them when it ends.

tools/slurm/start.sh (one-node Slurm) and tools/slurm/munge.sh start ``munged``,
``slurmctld`` and ``slurmd`` outside any network namespace, leaving those already
running alone: nothing of a test's own would stop them. The root conftest.py notes which
run when the session starts (``running``) and stops the others when it ends
(``stop_started``), so a suite leaves the machine as it found it. (Daemons in network
namespaces, sshd and the netns Slurm, end with their namespaces.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

PIDFILES: Final = {
    "munged": Path("/run/munge/munged.pid"),
    "slurmctld": Path("/run/slurmctld.pid"),
    "slurmd": Path("/run/slurmd.pid"),
}
"""Each daemon's pid file, as tools/slurm's scripts and slurm.conf set them."""

STOP_TIMEOUT: Final = 10.0
"""Seconds a daemon has to exit after SIGTERM, before SIGKILL."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running(pidfiles: Mapping[str, Path] = PIDFILES) -> dict[str, int]:
    """The daemons of ``pidfiles`` running now: name -> pid."""
    found: dict[str, int] = {}
    for name, pidfile in pidfiles.items():
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if _alive(pid):
            found[name] = pid
    return found


def stop_started(
    before: Mapping[str, int],
    pidfiles: Mapping[str, Path] = PIDFILES,
    timeout: float = STOP_TIMEOUT,
) -> list[str]:
    """Stop the daemons of ``pidfiles`` running now that ``before`` (``running()`` at the
    start) did not list, or listed with another pid; returns their names."""
    stopped = [(name, pid) for name, pid in running(pidfiles).items() if before.get(name) != pid]
    for _, pid in stopped:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    for _, pid in stopped:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [name for name, _ in stopped]
