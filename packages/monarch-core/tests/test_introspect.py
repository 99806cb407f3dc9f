"""What a proc says of itself when asked (``inspect_proc``) and what a client spawned
(``spawned_procs``): real procs, real actors, a frozen proc and a dead one."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.core import PeerLost, current_runtime, inspect_proc, spawned_procs
from monarch.core.testing import wait_until

pytestmark = pytest.mark.ours_only


class Counter(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def wait(self, gate: str) -> None:
        """Busy until the file ``gate`` exists (a message could not reach it meanwhile)."""
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2}, name="inspected")
    yield mesh
    mesh.stop().get(timeout=30)


@pytest.fixture(scope="module")
def counters(procs: ProcMesh) -> Any:
    mesh = procs.spawn("counters", Counter)
    mesh.ping.call().get()
    return mesh


def mine(name: str = "inspected") -> list[Any]:
    return [p for p in spawned_procs() if p.mesh == name]


def state_of(counters: Any, rank: int) -> Any:
    [proc] = [p for p in mine() if p.rank == rank]
    snap = inspect_proc(proc.address).get(timeout=30)
    [actor] = [a for a in snap.actors if a.mesh == "counters"]
    return snap, actor


def test_a_proc_reports_its_actors_and_itself(counters: Any) -> None:
    snap, actor = state_of(counters, 1)
    assert snap.pid == counters.slice(gpus=1).pid.call_one().get() and snap.rss > 0
    assert snap.threads >= 2 and snap.cpu_user + snap.cpu_system > 0 and snap.uptime > 0
    assert actor.class_name == f"{__name__}.Counter"
    assert (actor.rank, actor.point) == (1, "{'gpus': 1/2}")
    assert actor.state == "running" and actor.error == "" and actor.queued == 0
    assert actor.current == "" and actor.idle_for >= 0 and snap.stacks == []


def test_a_busy_actor_shows_its_endpoint_queue_and_stack(counters: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    one = counters.slice(gpus=0)
    one.wait.call_one(str(gate))
    queued = [one.ping.call_one() for _ in range(3)]
    deadline = time.monotonic() + 30  # the wait taken off the queue may not have started yet
    while time.monotonic() < deadline:
        actor = state_of(counters, 0)[1]
        if actor.current == "wait" and actor.queued == 3:
            break
        time.sleep(0.02)
    assert actor.current == "wait" and actor.queued == 3 and actor.busy_for >= 0
    [proc] = [p for p in mine() if p.rank == 0]
    snap = inspect_proc(proc.address, stacks=True).get(timeout=30)
    [thread] = [t for t in snap.stacks if t.ident == actor.thread]
    assert thread.name == "actor-counters" and thread.frames[-1].function == "wait"
    gate.touch()
    assert [f.get(timeout=30) for f in queued] == [1, 1, 1]


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from([0, 1]), max_size=12))
def test_messages_handled_count_every_call(counters: Any, ranks: list[int]) -> None:
    before = [state_of(counters, rank)[1].handled for rank in (0, 1)]
    for rank in ranks:
        counters.slice(gpus=rank).ping.call_one().get()
    after = [state_of(counters, rank)[1].handled for rank in (0, 1)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [ranks.count(0), ranks.count(1)]


def test_the_client_answers_for_itself() -> None:
    runtime = current_runtime()
    snap = inspect_proc(runtime.address, stacks=True).get(timeout=30)
    assert snap.pid == os.getpid() and snap.address == runtime.address
    assert "MainThread" in [t.name for t in snap.stacks]


def test_a_frozen_proc_does_not_answer_and_a_dead_one_is_lost() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="frozen")
    counter = procs.spawn("counter", Counter)
    pid = counter.pid.call_one().get()
    [proc] = mine("frozen")
    assert proc.pid == pid and proc.exited is None and proc.address is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError, match=r"did not answer within 0\.2s"):
            inspect_proc(proc.address, timeout=0.2).get(timeout=30)
    finally:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while mine("frozen")[0].exited is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mine("frozen")[0].exited == "was killed by signal 9"
    with pytest.raises(PeerLost):
        inspect_proc(proc.address).get(timeout=30)


def test_a_stopped_mesh_is_listed_with_its_exits() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="stopping")
    procs.initialized.get(timeout=30)
    assert [(p.rank, p.exited) for p in mine("stopping")] == [(0, None), (1, None)]
    assert {p.host for p in mine("stopping")} == {current_runtime().address}
    procs.stop().get(timeout=30)
    deadline = time.monotonic() + 30
    while any(p.exited is None for p in mine("stopping")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p.exited for p in mine("stopping")] == ["exited with code 0"] * 2


@pytest.mark.anyio
async def test_inspect_proc_is_awaited_on_either_backend(counters: Any) -> None:
    [proc] = [p for p in mine() if p.rank == 1]
    snap = await inspect_proc(proc.address)
    assert "counters" in [a.mesh for a in snap.actors]


def test_an_agent_holds_only_the_procs_that_still_run() -> None:
    """A host agent outlives many meshes (a worker serves job after job; here the client
    is this host's agent): each proc's exit lets go of it (``ProcSnapshot.children``).
    The agent kept every proc it ever started, one more per proc, for its whole life."""
    client = current_runtime().address

    def children() -> int:
        return inspect_proc(client).get(timeout=30).children

    before = children()
    for round_ in range(3):
        procs = this_host().spawn_procs(per_host={"gpus": 2}, name=f"held{round_}")
        procs.initialized.get(timeout=60)
        assert children() == before + 2
        procs.stop().get(timeout=30)
        wait_until(lambda: children() == before, 30, f"the agent to let go of held{round_}")
