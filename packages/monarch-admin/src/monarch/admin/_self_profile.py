"""What a proc records of itself for ``monarch profile``, and the system actor that asks it.

py-spy can read only processes of its own machine, and the torch profiler only the process
it runs in; so for a proc on another host (under ``monarch worker``), and for torch, the
admin server spawns a ``ProcProfiler`` on the procs for one profile: each records itself
for the window (py-spy against its own pid, ``--nonblocking``; the torch profiler, every
thread, where torch is imported) and sends the events back, each on the wall clock of its
host, to be merged into the one trace (``_profile``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from monarch.core import Actor, endpoint

from ._stacks import pyspy_path

EXTRA: Final = 30.0
"""Seconds beyond the profile's that a recorder may take to attach and write its file
(the torch profiler's start alone takes seconds on a loaded machine)."""
MARK: Final = "monarch.profile.window"
"""A torch record_function at the window's start: its time on torch's clock, against the
wall clock read inside it, places every torch event on the wall clock."""
TORCH_TID: Final = 1_000_000_000
"""Added to a torch event's thread id: torch's tracks stay apart from py-spy's threads."""


def now_us() -> int:
    return time.time_ns() // 1000


def pyspy_command(
    program: str, pid: int, seconds: float, rate: int, idle: bool, out: Path
) -> list[str]:
    """py-spy's ``record`` of ``pid`` into a Chrome trace, without pausing it."""
    command = [program, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))]
    command += ["--rate", str(rate), "--nonblocking", "--format", "chrometrace", "-o", str(out)]
    return command + (["--idle"] if idle else [])


def start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], deadline: float) -> str:
    """ "" if py-spy did its work, else what it said."""
    try:
        output, _ = process.communicate(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return "py-spy did not finish in time"
    return "" if process.returncode == 0 else output.strip()[-300:]


def record_self(seconds: float, rate: int, idle: bool, pyspy: bool, torch: bool) -> dict[str, Any]:
    """This process for ``seconds``: py-spy's samples of it (``pyspy``) and the torch
    profiler's events (``torch``, where torch is in use here; py-spy starts once the torch
    profiler runs, seconds later on a loaded machine, so both see the same window).
    Returns ``{pid, started_us, pyspy: events | None, torch: events | None, notes}``; what
    could not be recorded is said in ``notes``."""
    pid = os.getpid()
    answer: dict[str, Any] = {"pid": pid, "started_us": now_us(), "pyspy": None, "torch": None}
    notes: list[str] = []
    program = pyspy_path() if pyspy else None
    if pyspy and program is None:
        notes.append("py-spy is not installed where this proc runs")
    with tempfile.TemporaryDirectory(prefix="monarch-profile-") as folder:
        out = Path(folder) / "pyspy.json"
        running: list[subprocess.Popen[str]] = []

        def begin() -> None:
            if program is not None:
                answer["started_us"] = now_us()
                running.append(start(pyspy_command(program, pid, seconds, rate, idle, out)))

        if torch and "torch" in sys.modules:
            answer["torch"] = torch_window(seconds, Path(folder) / "torch.json", notes, begin)
        else:
            if torch:
                notes.append("torch is not in use in this proc")
            begin()
        deadline = time.monotonic() + seconds + EXTRA
        for process in running:
            error = finish(process, deadline)
            if error or not out.exists():
                notes.append(error or "py-spy wrote nothing")
            else:
                answer["pyspy"] = json.loads(out.read_text())
    answer["notes"] = notes
    return answer


def torch_window(
    seconds: float, out: Path, notes: list[str], begun: Callable[[], None]
) -> list[dict[str, Any]] | None:
    """The torch profiler over every thread of this process for ``seconds`` (``begun``
    called once it runs): its op slices on the wall clock (on tracks of their own), or
    None, with a note. Only where torch is imported already: a profiler would import it,
    seconds of start for nothing."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    options: dict[str, Any] = {}
    try:  # every thread: an actor's endpoints run on threads of their own
        experimental = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        options["experimental_config"] = experimental
    except (AttributeError, TypeError):
        notes.append("this torch profiles only the profiler's thread")
    with profile(activities=activities, **options) as prof:
        with record_function(MARK):
            wall = now_us()
        begun()
        time.sleep(seconds)  # the window: the proc's own threads run meanwhile
    prof.export_chrome_trace(str(out))
    events = json.loads(out.read_text()).get("traceEvents", [])
    mark = next((e for e in events if e.get("name") == MARK), None)
    if mark is None:
        notes.append("the torch profiler recorded nothing")
        return None
    offset = wall - float(mark["ts"])
    return [
        {**e, "ts": float(e["ts"]) + offset, "tid": TORCH_TID + int(e.get("tid", 0))}
        for e in events
        if e.get("ph") == "X" and isinstance(e.get("pid"), int) and e is not mark
        if isinstance(e.get("tid"), int)
    ]


class ProcProfiler(Actor):
    """Monarch's own actor (a system actor in the job's tables): spawned on the procs by
    the admin server for one ``monarch profile``, stopped after it."""

    @endpoint
    def record(
        self, seconds: float, rate: int, idle: bool, pyspy: bool, torch: bool
    ) -> dict[str, Any]:
        return record_self(seconds, rate, idle, pyspy, torch)
