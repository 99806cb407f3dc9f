"""A process's runtime loop keeps to the CPU of the thread it serves (``_placement``), and
nothing it starts keeps its pin: threads, and processes that import the core."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from monarch.actor import Accumulator, Actor, ActorMesh, endpoint, this_host
from monarch.config import configured
from monarch.core._placement import MASK_ENV, PROCESS_MASK
from monarch.core._runtime import _spin
from monarch.core.testing import wait_until

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(PROCESS_MASK) < 2,
    reason="needs Linux and 2 usable CPUs",
)


class Masks(Actor):
    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    def gated(self, gate: str) -> int:
        """Answers once ``gate`` exists: the caller attaches its ``then`` before that."""
        wait_until(lambda: os.path.exists(gate), 60, f"{gate} to be created")
        return 1

    @endpoint
    def masks(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """The CPUs of: the process, this actor's thread, the proc's loop (its main
        thread), and a thread this actor starts."""
        started: list[int] = []
        thread = threading.Thread(target=lambda: started.extend(os.sched_getaffinity(0)))
        thread.start()
        thread.join()
        return (
            sorted(PROCESS_MASK),
            sorted(os.sched_getaffinity(0)),
            sorted(os.sched_getaffinity(os.getpid())),
            sorted(started),
        )


@pytest.fixture
def uncontended(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's waiters never take the machine for busy (``_spin.yield_cpu``: on a
    loaded CI machine a yield may give the CPU away, and the loop is then unpinned), so
    its loop follows its waiter whenever it ends a batch."""
    monkeypatch.setattr(_spin, "CONTENDED_YIELD", float("inf"))
    monkeypatch.setattr(_spin, "_contended_until", 0.0)


def _pinned_threads() -> list[int]:
    """The native ids of this process's threads pinned to one CPU (one ended meanwhile
    is left out)."""
    pinned = []
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if len(os.sched_getaffinity(tid)) == 1:
                pinned.append(tid)
        except ProcessLookupError:
            pass
    return pinned


def _loop_pinned() -> bool:
    return bool(_pinned_threads())


def _ping_until_pinned(actor: ActorMesh[Masks]) -> None:
    def pinned() -> bool:
        actor.ping.call().get(timeout=60)  # each batch's end pins the loop to this CPU
        return _loop_pinned()

    wait_until(pinned, 60, "the client's loop to follow this thread")


def test_the_loops_follow_their_waiters_and_what_they_start_is_not_pinned(
    uncontended: None,
) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = procs.spawn("masks", Masks)
        _ping_until_pinned(actor)
        pinned = _pinned_threads()
        process, actor_thread, loop, started = actor.masks.call_one().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)
    # In this process: the loop alone, and this thread is never pinned.
    assert len(pinned) == 1
    assert pinned[0] != threading.get_native_id()
    assert sorted(os.sched_getaffinity(0)) == sorted(PROCESS_MASK)
    # In the proc (pinned there or not, as its load allows): the actor's thread, started by
    # the loop, and what user code starts from it have the process's CPUs.
    assert len(process) >= 2
    assert actor_thread == process
    assert started == process
    assert set(loop) <= set(process)


def _where() -> tuple[str, list[int], list[int]]:
    """The calling thread's name and CPUs, and those of a thread it starts."""
    started: list[int] = []
    thread = threading.Thread(target=lambda: started.extend(os.sched_getaffinity(0)))
    thread.start()
    thread.join()
    return threading.current_thread().name, sorted(os.sched_getaffinity(0)), sorted(started)


def test_user_code_on_the_loop_runs_unpinned(uncontended: None, tmp_path: Path) -> None:
    """A ``then`` function and an accumulator's ``combine`` run on the client's loop,
    pinned to its waiter's CPU between batches: they, and the threads they start, get
    the process's CPUs (torch's pools, started at a first parallel op, among them)."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        actor = procs.spawn("masks", Masks)
        _ping_until_pinned(actor)
        gate = tmp_path / "open"
        then = actor.slice(procs=0).gated.call_one(str(gate)).then(lambda _: _where())
        gate.touch()  # the reply comes after the ``then``: its function runs on the loop
        ran = then.get(timeout=60)
        seen: list[tuple[str, list[int], list[int]]] = []

        def combine(total: int, value: int) -> int:
            seen.append(_where())
            return total + value

        _ping_until_pinned(actor)
        assert Accumulator(actor.gated, 0, combine).accumulate(str(gate)).get(timeout=60) == 2
        _ping_until_pinned(actor)  # and the loop follows again once they are done
    finally:
        procs.stop().get(timeout=60)
    process = sorted(PROCESS_MASK)
    for name, mine, started in [ran, *seen]:
        assert name == "monarch-runtime"  # on the loop, the case that matters
        assert mine == process
        assert started == process


def test_the_loop_is_unpinned_while_the_machine_has_no_cpu_to_spare(
    uncontended: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a yield showed every CPU busy (``_spin.yield_cpu``), waiters sleep at once and
    the loop leaves its CPU for the scheduler to run it wherever one is free."""
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = procs.spawn("masks", Masks)
        _ping_until_pinned(actor)
        monkeypatch.setattr(_spin, "_contended_until", time.perf_counter() + 3600)
        actor.ping.call_one().get(timeout=60)
        assert not _loop_pinned()
        monkeypatch.setattr(_spin, "_contended_until", 0.0)
        _ping_until_pinned(actor)
    finally:
        procs.stop().get(timeout=60)


def test_a_proc_started_while_the_loop_is_pinned_gets_the_process_cpus(
    uncontended: None,
) -> None:
    """Procs started by this process's agent on its pinned loop (a ``Popen`` from there,
    ``fork_procs`` off) and forked by the zygote both get the spawner's CPUs."""
    warm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = warm.spawn("masks", Masks)
        for forked in (False, True):
            _ping_until_pinned(actor)
            with configured(fork_procs=forked):
                procs = this_host().spawn_procs(per_host={"procs": 1})
                try:
                    masks = procs.spawn("masks", Masks).masks.call_one().get(timeout=60)
                finally:
                    procs.stop().get(timeout=60)
            process, actor_thread, _, _ = masks
            assert process == sorted(PROCESS_MASK), forked
            assert actor_thread == process, forked
    finally:
        warm.stop().get(timeout=60)


SCRIPT = "import os, monarch.core; print(sorted(os.sched_getaffinity(0)))"


@pytest.mark.parametrize("inherited", [True, False], ids=["pinned-loop", "user-restricted"])
def test_a_process_started_by_a_pinned_loop_takes_back_its_spawners_cpus(inherited: bool) -> None:
    """A child started while the loop is pinned inherits the loop's one CPU if the loop
    started it: it takes back the spawner's CPUs as it imports the core. A child the user
    restricted to another CPU keeps what the user gave it."""
    cpus = sorted(PROCESS_MASK)
    pinned, other = cpus[0], cpus[1]
    child_cpu = pinned if inherited else other
    env = {**os.environ, MASK_ENV: f"{pinned}:{','.join(map(str, cpus))}"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, {child_cpu}),
    )
    assert done.returncode == 0, done.stderr
    expected = cpus if inherited else [child_cpu]
    assert done.stdout.split("\n")[-2] == str(expected), done.stdout


FOREIGN_LOOP = """if True:
    import os, threading
    from monarch.core import _placement
    from monarch.core._host._rehearsal import rehearse_round
    from monarch.core._runtime import _spin

    _spin.CONTENDED_YIELD = float("inf")  # a loaded machine would unpin it anyway
    cpus = sorted(_placement.PROCESS_MASK)
    main = os.sched_getaffinity(0)

    def wait_on_the_last_cpu():
        os.sched_setaffinity(0, {cpus[-1]})
        _placement.note_waiting()

    waiter = threading.Thread(target=wait_on_the_last_cpu)
    waiter.start()
    waiter.join()
    assert _placement._state.waiter == cpus[-1], _placement._state.waiter
    assert rehearse_round()  # two runtimes exchanging messages on this thread's loop
    print(sorted(os.sched_getaffinity(0)) == sorted(main))
"""


def test_a_loop_on_a_thread_that_is_not_its_own_never_follows_a_waiter() -> None:
    """The zygote rehearses a proc's start on its main thread, as a test may run a
    runtime on its own loop: such a loop never pins its thread to a waiter's CPU (the
    thread, and every thread and process it starts later, would keep that one CPU: a
    CI worker's main thread was left so). Only a runtime on a loop thread of its own
    follows its waiters. Fails without ``Runtime.own_thread``."""
    done = subprocess.run(
        [sys.executable, "-c", FOREIGN_LOOP], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True"]
