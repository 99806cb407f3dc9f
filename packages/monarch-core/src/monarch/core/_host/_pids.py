"""Whether a process runs, by pid: the one check the launchers, the admin's discovery, the
suite's daemon book-keeping and the tests all make (``monarch.core.lowlevel`` publishes it)."""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (``R``, ``S``, ``Z``, ``T``...), None if gone.

    Where there is no ``/proc`` (macOS), ``R`` for any process that exists."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        if _PROC.is_dir():
            return None
        return "R" if _exists(pid) else None
    return stat.rpartition(")")[2].split()[0]


def process_alive(pid: int) -> bool:
    """Running: it exists and is no zombie (one nobody reaps, as this container's init may
    not, has ended all the same)."""
    return process_state(pid) not in (None, "Z")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True
