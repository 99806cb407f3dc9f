"""Every future ends (a value or an error, never a hang) whatever the interleaving of
casts, completions and proc deaths from several threads, on asyncio and uvloop.

A caller's thread may cast by itself (``ActorMesh._cast_here``), so the objects a cast
makes (its ``Gather``) are built on that thread while the loop may already be failing them
for a dead peer. The controller (``race_controller.py``) runs in a process of its own per
event loop; hypothesis draws the schedules (which thread casts what, waits, kills which
proc when), and a stress run makes thousands of calls from several threads to a mesh with
a dead proc, where the race used to lose a few calls in 10,000. Any exception the runtime
logs there (a failed loop request or watcher) fails the test too.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core.testing import Child

CONTROLLER = Path(__file__).with_name("race_controller.py")
ANSWER = 120.0
"""Seconds a request may take in all (the controller's own deadline is 20 s a future)."""


def _loops() -> list[Any]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        has_uvloop = False
    else:
        has_uvloop = True
    skip = pytest.mark.skipif(not has_uvloop, reason="uvloop is not installed")
    return ["asyncio", pytest.param("uvloop", marks=skip)]


@pytest.fixture(scope="module", params=_loops())
def controller(request: pytest.FixtureRequest) -> Iterator[Child]:
    child = Child(
        [sys.executable, str(CONTROLLER)],
        {**os.environ, "MONARCH_EVENT_LOOP": request.param},
        stdin=True,
    )
    try:
        assert child.json(60)["loop"].startswith(request.param)
        yield child
    finally:
        child.kill()


def ask(controller: Child, request: dict[str, Any]) -> dict[str, Any]:
    controller.send_line(json.dumps(request))
    return controller.json(ANSWER)


@st.composite
def schedules(draw: st.DrawFn) -> dict[str, Any]:
    procs = draw(st.integers(2, 4))
    rank = st.integers(0, procs - 1)
    times = st.integers(1, 30)
    ops = st.one_of(
        st.builds(lambda a, b, k: ["call", min(a, b), max(a, b) + 1, k], rank, rank, times),
        st.builds(lambda r, k: ["one", r, k], rank, times),
        st.builds(lambda k: ["choose", k], times),
        st.builds(lambda k: ["stream", k], st.integers(1, 4)),
        st.builds(lambda k: ["raise", k], st.integers(1, 5)),
        st.just(["wait"]),
        st.builds(lambda r: ["kill", r], rank),
        st.builds(lambda r: ["exit", r], rank),
    )
    threads = draw(st.lists(st.lists(ops, min_size=1, max_size=10), min_size=1, max_size=4))
    # At least one death, at any point of any thread.
    death = draw(st.builds(lambda how, r: [how, r], st.sampled_from(["kill", "exit"]), rank))
    thread = draw(st.sampled_from(threads))
    thread.insert(draw(st.integers(0, len(thread))), death)
    return {"procs": procs, "threads": threads}


@settings(max_examples=8, deadline=None)
@given(schedule=schedules())
def test_every_future_ends_whatever_the_interleaving(
    controller: Child, schedule: dict[str, Any]
) -> None:
    answer = ask(controller, {"schedule": schedule})
    assert answer["hung"] == []
    assert answer["bad"] == []
    assert answer["logged"] == []


def test_calls_from_threads_to_a_mesh_with_a_dead_proc_all_fail(controller: Child) -> None:
    answer = ask(controller, {"stress": {"calls": 12_000, "threads": 4}})
    assert answer["hung"] == []
    assert answer["bad"] == []
    assert answer["logged"] == []
