"""Whether a process runs, by pid: the one check the launchers, the admin's discovery, the
suite's daemon book-keeping and the tests all make (``monarch.core.lowlevel`` publishes it)."""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (the state first), None if
    the process is gone or there is no ``/proc``."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:  # gone (ENOENT, ESRCH while it exits), or no /proc
        return None
    return stat.rpartition(")")[2].split()


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/PID/stat`` (``R``, ``S``, ``Z``, ``T``...), None if gone.

    Where there is no ``/proc`` (macOS), ``R`` for any process that exists."""
    fields = _stat(pid)
    if fields is not None:
        return fields[0]
    return "R" if not _PROC.is_dir() and _exists(pid) else None


def process_start(pid: int) -> str | None:
    """When the process started (``/proc/PID/stat``'s start time), None if gone or unknown:
    with its pid it names one process, since pids are reused."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def process_alive(pid: int, start: str | None = None) -> bool:
    """Running: it exists and is no zombie (one nobody reaps, as this container's init may
    not, has ended all the same); with ``start`` (``process_start`` when it was seen), still
    that process and not another that was given its pid since."""
    fields = _stat(pid)
    if fields is None:
        return not _PROC.is_dir() and start is None and _exists(pid)
    return fields[0] != "Z" and (start is None or fields[19:20] == [start])


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True
