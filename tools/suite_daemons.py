"""The system daemons the test suite starts, and stopping them when it ends.

tools/slurm/start.sh (one-node Slurm) and tools/slurm/munge.sh start ``munged``,
``slurmctld`` and ``slurmd`` outside any network namespace, leaving those already running
alone: nothing of a test's own stops them. The root conftest.py names a record file in
``$MONARCH_TEST_DAEMONS`` when the session starts; each script appends ``NAME PID`` there
for a daemon it started, and the session stops exactly those when it ends
(``stop_recorded``): never one that was running before, nor one another test session on
this machine started meanwhile. (Daemons in network namespaces, sshd and the netns Slurm,
end with their namespaces.)

Whether a recorded daemon still runs is monarch-core's ``process_alive``, imported only when a
daemon was recorded: the tests that start daemons are monarch-jobs', so their session has
loaded monarch-core already, while a session without it (the transport's own environment)
never pays for importing it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Final

RECORD_ENV: Final = "MONARCH_TEST_DAEMONS"
"""The file the start scripts append ``NAME PID`` to, for each daemon they started."""

STOP_TIMEOUT: Final = 10.0
"""Seconds a daemon has to exit after SIGTERM, before SIGKILL."""


def _alive(pid: int) -> bool:
    from monarch.core.lowlevel import process_alive

    return process_alive(pid)


def recorded(record: Path) -> list[tuple[str, int]]:
    """The daemons ``record`` lists that still run: (name, pid)."""
    found: list[tuple[str, int]] = []
    try:
        lines = record.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        name, _, pid = line.partition(" ")
        if pid.strip().isdigit() and _alive(int(pid)):
            found.append((name, int(pid)))
    return found


def stop_recorded(record: Path, timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stop the daemons ``record`` lists (SIGTERM, then SIGKILL after ``timeout``); their
    names."""
    running = recorded(record)
    for _, pid in running:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + timeout
    for _, pid in running:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [name for name, _ in running]
