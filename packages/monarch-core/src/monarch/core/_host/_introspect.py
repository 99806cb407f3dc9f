"""What a proc says of itself when asked: its actors, its process, its Python stacks.

Any process answers an ``Introspect`` request (of the ``proc`` ``Service``, see ``_ask``)
with a ``ProcSnapshot``: the actors it hosts (state, why one failed or stopped, messages
handled, queue depth, the endpoint running now and for how long, the last activity), its
pid, CPU times and resident memory (from ``/proc/self``), and on request every thread's
Python stack, the dump a process takes of itself (``sys._current_frames``). Nothing is
kept or sampled between requests: a proc pays only when asked, and its runners keep three
plain fields per message.

``inspect_proc`` asks one proc and never waits longer than its timeout: a proc whose
loop is held (an ``async def`` endpoint blocking it, a proc stopped by a signal) is
reported as not answering, a dead one as lost. The admin server (``monarch.admin``)
walks ``spawned_procs`` with it.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from typing import Final

import msgspec

from monarch.core._mesh._ask import Service, ask
from monarch.core._mesh._future import Future
from monarch.core._runner import ActorRunner
from monarch.core._runner._context import running
from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._messages import ActorState, ProcSnapshot, StackFrame, ThreadStack

from ._watching import running_children

_STARTED: Final = time.monotonic()
"""About when this process started (the core is among the first things a proc imports)."""

ANSWER_TIMEOUT: Final = 2.0
"""Seconds ``inspect_proc`` waits for an answer by default."""


def actor_state(runner: ActorRunner, now: float) -> ActorState:
    """One actor as its runner sees it (read from the loop; the runner's thread may be
    writing its fields meanwhile: each read is one attribute, whole)."""
    if runner.failure is not None:
        state, error = "failed", runner.failure_report or repr(runner.failure)
    elif runner.stopped is not None:
        state, error = "stopped", runner.stopped
    elif runner.instance is None:
        state, error = "starting", ""
    else:
        state, error = "running", ""
    began, current = runner.began, runner.current
    return ActorState(
        actor_id=runner.info.actor_id,
        mesh=runner.spawn.name,
        class_name=runner.info.class_name or "",
        rank=runner.rank.rank,
        point=repr(runner.rank),
        state=state,
        error=error,
        handled=runner.handled,
        queued=runner.queued(),
        current=current,
        busy_for=now - began if current else 0.0,
        idle_for=now - began if began else -1.0,
        thread=runner.thread_id,
    )


def thread_stacks() -> list[ThreadStack]:
    """Every thread's Python stack, outermost frame first (the caller's included)."""
    threads = {t.ident: t for t in threading.enumerate()}
    stacks = []
    for ident, frame in sys._current_frames().items():
        thread = threads.get(ident)
        frames = [
            StackFrame(f.filename, f.lineno or 0, f.name, f.line or "")
            for f in traceback.extract_stack(frame)
        ]
        name = thread.name if thread is not None else f"thread {ident}"
        daemon = thread.daemon if thread is not None else False
        stacks.append(ThreadStack(name, ident, frames, daemon))
    return stacks


def _rss() -> int:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def snapshot(runtime: Runtime, stacks: bool = False) -> ProcSnapshot:
    """This process as an ``Introspect`` answers it."""
    now = time.monotonic()
    actors = [
        actor_state(runner, now)
        for runner in list(running.values())
        if isinstance(runner, ActorRunner)
    ]
    times = os.times()
    return ProcSnapshot(
        address=runtime.address,
        pid=os.getpid(),
        hostname=socket.gethostname(),
        cpu_user=times.user,
        cpu_system=times.system,
        rss=_rss(),
        threads=_thread_count(),
        actors=actors,
        stacks=thread_stacks() if stacks else [],
        uptime=now - _STARTED,
        children=len(running_children()),
    )


class Introspect(msgspec.Struct, tag="introspect", frozen=True):
    """Ask a proc for a ``ProcSnapshot`` of itself; with ``stacks``, its threads'
    Python stacks too (the dump a proc takes of itself)."""

    stacks: bool = False


ProcQuery = Introspect
"""What the ``proc`` service answers: a union of tagged Structs (add a query here)."""
ProcAnswer = ProcSnapshot
"""What it answers with (a union of the answers' Structs, tagged)."""


def answer_query(query: ProcQuery) -> ProcAnswer:
    """The ``proc`` service's handler (on the proc's runtime loop)."""
    return snapshot(current_runtime(), query.stacks)


PROC_SERVICE: Final = Service("proc", ProcQuery, answer_query, answers=ProcAnswer)
"""What every proc says of itself when asked (monarch-admin's, monarch-telemetry's view)."""


def inspect_proc(
    address: str, stacks: bool = False, timeout: float = ANSWER_TIMEOUT
) -> Future[ProcSnapshot]:
    """Ask the proc at ``address`` for its ``ProcSnapshot`` (from any thread).

    Fails with ``TimeoutError`` when it does not answer within ``timeout`` seconds (its
    loop is held, or it is stopped), and with ``PeerLost`` when it is gone.
    """
    answer: Future[ProcSnapshot] = ask(address, Introspect(stacks), timeout)
    return answer


def snapshot_procs(
    addresses: Iterable[str], timeout: float = ANSWER_TIMEOUT
) -> dict[str, ProcSnapshot | BaseException]:
    """Every proc's ``ProcSnapshot``, or why there is none (blocks; not on the loop).

    All are asked at once and waited for ``timeout`` (and a second for the replies in
    flight) at most; a proc that cannot be asked (the runtime stopping) is left out.
    """
    asked: dict[str, Future[ProcSnapshot]] = {}
    for address in addresses:
        try:
            asked[address] = inspect_proc(address, timeout=timeout)
        except RuntimeError:  # the client's runtime is stopping
            pass
    deadline = time.monotonic() + timeout + 1.0
    answers: dict[str, ProcSnapshot | BaseException] = {}
    for address, future in asked.items():
        try:
            answers[address] = future.get(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - the proc's state says it
            answers[address] = exc
    return answers
