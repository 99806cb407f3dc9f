"""Sampling every proc of a job at once with py-spy, for ``/v1/profile`` (``monarch profile``).

py-spy (``record --nonblocking``: the procs are not paused) runs against every live proc on
this machine, the client too, for the same seconds, all at once. Its Chrome trace of each
(a slice per run of identical samples, nested by frame, per thread) is moved onto the wall
clock and onto the proc's own process track (its pid, named by mesh, rank and address),
so that it lies beside the job's spans (monarch-telemetry's timeline) in one trace; the same
samples, as "proc;thread;frame;..." stacks with the microseconds spent in each, make the
flame graph (``_flamegraph``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from monarch.core import SpawnedProc

from ._stacks import pyspy_path

MAX_SECONDS: Final = 300.0
"""The longest profile asked in one request."""
EXTRA: Final = 30.0
"""Seconds py-spy may take beyond the profile's to attach and write its file."""


@dataclass
class Profile:
    """What the samples of one profile gave."""

    events: list[dict[str, Any]] = field(default_factory=list)
    stacks: dict[str, float] = field(default_factory=dict)
    """``proc;thread;outer frame;...;inner frame`` -> microseconds sampled there."""
    notes: list[str] = field(default_factory=list)
    """Procs that could not be sampled, and why."""


def check(seconds: float, rate: int) -> None:
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be more than 0 and at most {MAX_SECONDS:g}, not {seconds}")
    if not 1 <= rate <= 1000:
        raise ValueError(f"rate must be 1 to 1000 samples a second, not {rate}")


def sample(procs: list[SpawnedProc], seconds: float, rate: int, idle: bool) -> Profile:
    """Sample ``procs`` (live, on this machine) for ``seconds`` at ``rate`` per second;
    ``idle``: threads that wait are sampled too. ``LookupError`` without py-spy."""
    check(seconds, rate)
    program = pyspy_path()
    if program is None:
        raise LookupError("py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)")
    profile = Profile()
    with tempfile.TemporaryDirectory(prefix="monarch-profile-") as folder:
        started = time.time_ns() // 1000
        running = []
        for proc in procs:
            out = Path(folder) / f"{proc.pid}.json"
            command = [program, "record", "--pid", str(proc.pid), "--duration"]
            command += [str(max(1, round(seconds))), "--rate", str(rate), "--nonblocking"]
            command += ["--format", "chrometrace", "-o", str(out)] + (["--idle"] if idle else [])
            running.append((proc, out, _start(command)))
        deadline = time.monotonic() + seconds + EXTRA
        for proc, out, process in running:
            name = f"{proc.mesh}[{proc.rank}]"
            error = _finish(process, deadline)
            if error or not out.exists():
                profile.notes.append(f"{name} ({proc.address}): {error or 'py-spy wrote nothing'}")
                continue
            events = json.loads(out.read_text())
            _add(profile, proc, name, events, started)
    return profile


def _start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(process: subprocess.Popen[str], deadline: float) -> str:
    """ "" if py-spy did its work, else what it said."""
    try:
        output, _ = process.communicate(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return "py-spy did not finish in time"
    return "" if process.returncode == 0 else output.strip()[-300:]


def _add(profile: Profile, proc: SpawnedProc, name: str, events: list[Any], started: int) -> None:
    """One proc's py-spy trace: onto its process track at wall-clock time, and its stacks
    (each frame's own time: its span less its callees')."""
    pid = proc.pid
    profile.events.append(_meta("process_name", pid, 0, f"{name} {proc.address} (pid {pid})"))
    open_frames: dict[int, list[list[Any]]] = {}
    for event in events:
        tid, ts = int(event.get("tid", 0)), started + int(event.get("ts", 0))
        if tid not in open_frames:
            open_frames[tid] = []
            profile.events.append(_meta("thread_name", pid, tid, f"py-spy thread {tid}"))
        where = event.get("args") or {}
        frame = f"{event.get('name', '?')} ({os.path.basename(str(where.get('filename', '')))})"
        profile.events.append({**event, "pid": pid, "tid": tid, "ts": ts, "cat": "py-spy"})
        stack = open_frames[tid]
        if event.get("ph") == "B":
            stack.append([frame, ts, 0])  # frame, when it began, its callees' time
        elif event.get("ph") == "E" and stack:
            frame, begun, inner = stack.pop()
            spent = ts - begun
            path = ";".join([name, f"thread {tid}", *(f[0] for f in stack), frame])
            profile.stacks[path] = profile.stacks.get(path, 0.0) + max(spent - inner, 0)
            if stack:
                stack[-1][2] += spent


def _meta(name: str, pid: int, tid: int, value: str) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {"name": value}}
