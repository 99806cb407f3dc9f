"""The debugger's entry points, which every process loads: the rest is imported when
first used (pdb at a proc's first breakpoint, the console at the root's first session), so
that a proc starts without them.

``breakpoint()`` in an endpoint: that actor pauses (the others of its proc go on) and its
session waits at the root client's console for ``monarch debug``. Procs install
:func:`breakpoint_hook` as ``sys.breakpointhook``; outside an actor it is Python's own. An
endpoint that raises after a breakpoint stopped in it gets a post-mortem session
(upstream's rule) before its caller hears of the error.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from types import FrameType, TracebackType
from typing import Any

from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._messages import DebugStart
from monarch.core._runtime._scope import current_context

_PACKAGE = __name__.rpartition(".")[0]

debuggers: dict[tuple[str, int], Any] = {}
"""This proc's debuggers (``_pdb.RemotePdb``) by actor id and message rank: one each,
kept across breakpoints, as its breakpoints are."""


def breakpoint_hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of a proc."""
    if os.environ.get("PYTHONBREAKPOINT") == "0":
        return
    context = current_context.get()
    if context is None:  # not an actor's code: Python's own
        sys.__breakpointhook__(*args, **kwargs)
        return
    frame = sys._getframe(1)
    debugger = _debugger_for(context)
    debugger.stopped_in = _stack(frame)
    debugger.set_trace(frame)


def post_mortem(exc: BaseException) -> None:
    """Called by a runner with what an endpoint raised: a post-mortem session if a
    breakpoint stopped in this endpoint's code."""
    if not debuggers:
        return
    context = current_context.get()
    if context is None:
        return
    instance = context.actor_instance
    debugger = debuggers.get((instance.actor_id, context.message_rank.rank))
    tb = exc.__traceback__
    if debugger is None or tb is None or not debugger.stopped_in:
        return
    frames = set()
    walk: TracebackType | None = tb
    while walk is not None:
        frames.add(id(walk.tb_frame))
        walk = walk.tb_next
    if any(id(frame) in frames for frame in debugger.stopped_in):
        debugger.stopped_in = ()
        debugger.post_mortem(tb)


def _debugger_for(context: Any) -> Any:
    instance, rank = context.actor_instance, context.message_rank
    key = (instance.actor_id, rank.rank)
    debugger = debuggers.get(key)
    if debugger is None:
        remote = importlib.import_module(f"{_PACKAGE}._pdb")
        start = DebugStart(
            instance.name, rank.rank, dict(rank.items()), remote.hostname(), os.getpid()
        )
        debugger = debuggers[key] = remote.RemotePdb(current_runtime(), start)
    return debugger


def _stack(frame: FrameType | None) -> tuple[FrameType, ...]:
    """The frames from ``frame`` out (the endpoint's among them)."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return tuple(frames)


def install_console(runtime: Runtime) -> None:
    """Offer the ``debug`` service on the root client's listener (see ``_console``)."""
    importlib.import_module(f"{_PACKAGE}._console").install_console(runtime)


@functools.cache
def debug_controller() -> Any:
    """The job's DebugController (an ActorMesh of one in the root client, spawned on first
    use): upstream's handle on the sessions (``list``, ``wait_pending_session``)."""
    return importlib.import_module(f"{_PACKAGE}._controller").spawn_debug_controller()
