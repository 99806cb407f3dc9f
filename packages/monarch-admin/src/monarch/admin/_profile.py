"""Sampling every proc of a job at once with py-spy (and the torch profiler), for
``/v1/profile`` (``monarch profile``).

py-spy (``record --nonblocking``: the procs are not paused) runs against every live proc on
this machine, the client too, for the same seconds, all at once; a proc on another host
records itself and sends its samples back, and so does each proc for the torch profiler
(``_self_profile``). py-spy's Chrome trace of each
(a slice per run of identical samples, nested by frame, per thread) is moved onto the wall
clock and onto the proc's own process track (its pid, named by mesh, rank and address),
so that it lies beside the job's spans (monarch-telemetry's timeline) in one trace; the same
samples, as "proc;thread;frame;..." stacks with the microseconds spent in each, make the
flame graph (``_flamegraph``). Torch's op slices go on the same process track, on
thread tracks of their own (``torch thread N``).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from socket import SOCK_DGRAM
from typing import Any, Final
from urllib.parse import urlsplit

from monarch.core import (
    ActorMesh,
    Future,
    NDSlice,
    Runtime,
    Shape,
    SpawnedProc,
    current_runtime,
    spawn_actor_mesh,
)

from ._self_profile import (
    EXTRA,
    TORCH_TID,
    ProcProfiler,
    finish,
    now_us,
    pyspy_command,
    record_self,
    start,
)
from ._stacks import pyspy_path

MAX_SECONDS: Final = 300.0
"""The longest profile asked in one request."""


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


def sample(
    procs: list[SpawnedProc],
    seconds: float,
    rate: int,
    idle: bool,
    torch: bool = False,
    is_local: Callable[[SpawnedProc], bool] | None = None,
) -> Profile:
    """Sample ``procs`` (live) for ``seconds`` at ``rate`` per second; ``idle``: threads
    that wait are sampled too; ``torch``: the torch profiler too, where a proc uses torch.
    Procs of this machine (``is_local``) are read by py-spy from outside (it sees a proc
    whose loop is held); the others, and torch everywhere, record themselves
    (``_self_profile``); ``is_local`` defaults to ``on_this_host``. ``LookupError``
    without py-spy here."""
    check(seconds, rate)
    program = pyspy_path()
    if program is None:
        raise LookupError("py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)")
    runtime = current_runtime()
    here = on_this_host if is_local is None else is_local
    local = [p for p in procs if p.address == runtime.address or here(p)]
    if torch:  # each proc records itself: py-spy once its torch profiler has started
        local = [p for p in local if p.address == runtime.address]
    asked = [p for p in procs if p not in local]
    profile = Profile()
    asking = _ask(runtime, asked, seconds, rate, idle, torch)
    with tempfile.TemporaryDirectory(prefix="monarch-profile-") as folder:
        started = now_us()
        running = []
        for proc in [] if torch else local:
            out = Path(folder) / f"{proc.pid}.json"
            command = pyspy_command(program, proc.pid, seconds, rate, idle, out)
            running.append((proc, out, start(command)))
        itself: list[tuple[SpawnedProc, dict[str, Any] | BaseException]] = []
        if torch:  # the client records itself, as each proc does
            itself = [(proc, record_self(seconds, rate, idle, True, True)) for proc in local]
        deadline = time.monotonic() + seconds + EXTRA
        for proc, out, process in running:
            name = f"{proc.mesh}[{proc.rank}]"
            error = finish(process, deadline)
            if error or not out.exists():
                profile.notes.append(f"{name} ({proc.address}): {error or 'py-spy wrote nothing'}")
                continue
            _add(profile, proc.pid, name, proc.address or "", json.loads(out.read_text()), started)
    for proc, answer in [*itself, *_answers(asking, deadline)]:
        name = f"{proc.mesh}[{proc.rank}]"
        if isinstance(answer, BaseException):
            profile.notes.append(f"{name} ({proc.address}): {answer}")
            continue
        pid, address = int(answer["pid"]), proc.address or ""
        if answer["pyspy"] is not None:
            _add(profile, pid, name, address, answer["pyspy"], int(answer["started_us"]))
        _add_torch(profile, pid, answer["torch"])
        notes = [n for n in answer["notes"] if not n.startswith("torch is not in use")]
        profile.notes += [f"{name} ({proc.address}): {note}" for note in notes]
    return profile


def on_this_host(proc: SpawnedProc) -> bool:
    """Whether ``proc`` listens on this host, where py-spy here reads it: at a Unix socket,
    or at an address of this host (of its network namespace: a socket binds to it)."""
    where = urlsplit(proc.address or "")
    if where.scheme == "unix" or not where.hostname:
        return True
    try:
        family, kind, _, _, address = socket.getaddrinfo(where.hostname, 0, type=SOCK_DGRAM)[0]
        with socket.socket(family, kind) as probe:
            probe.bind(address)
    except OSError:
        return False
    return True


Asking = tuple[ActorMesh[ProcProfiler] | None, list[tuple[SpawnedProc, Future[Any]]]]


def _ask(
    runtime: Runtime,
    procs: list[SpawnedProc],
    seconds: float,
    rate: int,
    idle: bool,
    torch: bool,
) -> Asking:
    """A ``ProcProfiler`` on each of ``procs``, asked to record itself (py-spy, and torch
    if ``torch``): one call per proc, so that one that cannot answer does not keep the
    others' answers."""
    if not procs:
        return None, []
    shape = Shape(["procs"], NDSlice(0, [len(procs)], [1]))
    addresses = [p.address or "" for p in procs]
    mesh = spawn_actor_mesh(runtime, "profiler", ProcProfiler, addresses, shape, (), {})
    calls = [
        (proc, mesh.slice(procs=i).record.call_one(seconds, rate, idle, True, torch))
        for i, proc in enumerate(procs)
    ]
    return mesh, calls


def _answers(
    asking: Asking, deadline: float
) -> Iterator[tuple[SpawnedProc, dict[str, Any] | BaseException]]:
    mesh, calls = asking
    for proc, call in calls:
        try:
            yield proc, call.get(timeout=max(deadline - time.monotonic(), 1))
        except Exception as exc:  # noqa: BLE001 - one proc's failure is a note
            yield proc, exc
    if mesh is not None:
        mesh.stop()  # not waited on: a proc that did not answer may not answer this either


def _add(
    profile: Profile, pid: int, name: str, address: str, events: list[Any], started: int
) -> None:
    """One proc's py-spy trace: onto its process track at wall-clock time, and its stacks
    (each frame's own time: its span less its callees')."""
    profile.events.append(_meta("process_name", pid, 0, f"{name} {address} (pid {pid})"))
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


def _add_torch(profile: Profile, pid: int, events: list[Any] | None) -> None:
    """One proc's torch profiler events (on the wall clock already), on that proc's
    process track, a thread track per torch thread (``torch thread N``)."""
    named: set[int] = set()
    for event in events or ():
        tid = int(event["tid"])
        if tid not in named:
            named.add(tid)
            thread = f"torch thread {tid - TORCH_TID}"
            profile.events.append(_meta("thread_name", pid, tid, thread))
        profile.events.append({**event, "pid": pid, "cat": "torch"})


def _meta(name: str, pid: int, tid: int, value: str) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": {"name": value}}
