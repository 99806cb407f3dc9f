"""A process's runtime loop keeps to the CPU of the thread it serves (``_placement``), and
nothing it starts keeps its pin: threads, and processes that import the core."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from monarch.actor import Accumulator, Actor, endpoint, this_host
from monarch.config import configured
from monarch.core._placement import MASK_ENV, PROCESS_MASK
from monarch.core._runtime import _spin

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(PROCESS_MASK) < 2,
    reason="needs Linux and 2 usable CPUs",
)


class Masks(Actor):
    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    def slow(self) -> int:
        time.sleep(0.3)  # the caller attaches its ``then`` before the reply comes
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


def test_the_loops_follow_their_waiters_and_what_they_start_is_not_pinned() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = procs.spawn("masks", Masks)
        for _ in range(200):  # round trips: each loop ends batches with a waiter noted
            actor.ping.call_one().get(timeout=60)
        process, actor_thread, loop, started = actor.masks.call_one().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)
    assert len(process) >= 2
    assert actor_thread == process  # the actor's thread, started by the loop: unpinned
    assert started == process  # and what user code starts there
    assert len(loop) == 1 and loop[0] in process  # the proc's loop: on its waiter's CPU
    # The client's own loop follows this thread; this thread is never pinned.
    assert sorted(os.sched_getaffinity(0)) == sorted(PROCESS_MASK)
    masks = [os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")]
    assert any(len(mask) == 1 for mask in masks), masks


def _where() -> tuple[str, list[int], list[int]]:
    """The calling thread's name and CPUs, and those of a thread it starts."""
    started: list[int] = []
    thread = threading.Thread(target=lambda: started.extend(os.sched_getaffinity(0)))
    thread.start()
    thread.join()
    return threading.current_thread().name, sorted(os.sched_getaffinity(0)), sorted(started)


def _loop_pinned() -> bool:
    return any(len(os.sched_getaffinity(int(tid))) == 1 for tid in os.listdir("/proc/self/task"))


def test_user_code_on_the_loop_runs_unpinned() -> None:
    """A ``then`` function and an accumulator's ``combine`` run on the client's loop,
    pinned to its waiter's CPU between batches: they, and the threads they start, get
    the process's CPUs (torch's pools, started at a first parallel op, among them)."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        actor = procs.spawn("masks", Masks)
        for _ in range(200):
            actor.ping.call().get(timeout=60)
        assert _loop_pinned()
        ran = actor.slice(procs=0).slow.call_one().then(lambda _: _where()).get(timeout=60)
        seen: list[tuple[str, list[int], list[int]]] = []

        def combine(total: int, value: int) -> int:
            seen.append(_where())
            return total + value

        assert Accumulator(actor.slow, 0, combine).accumulate().get(timeout=60) == 2
        for _ in range(200):  # and the loop follows again once they are done
            actor.ping.call().get(timeout=60)
        assert _loop_pinned()
    finally:
        procs.stop().get(timeout=60)
    process = sorted(PROCESS_MASK)
    for name, mine, started in [ran, *seen]:
        assert name == "monarch-runtime"  # on the loop, the case that matters
        assert mine == process
        assert started == process


def test_the_loop_is_unpinned_while_the_machine_has_no_cpu_to_spare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a yield showed every CPU busy (``_spin.yield_cpu``), waiters sleep at once and
    the loop leaves its CPU for the scheduler to run it wherever one is free."""
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = procs.spawn("masks", Masks)
        for _ in range(200):
            actor.ping.call_one().get(timeout=60)
        assert _loop_pinned()
        monkeypatch.setattr(_spin, "_contended_until", time.perf_counter() + 3600)
        actor.ping.call_one().get(timeout=60)
        assert not _loop_pinned()
        monkeypatch.setattr(_spin, "_contended_until", 0.0)
        for _ in range(200):
            actor.ping.call_one().get(timeout=60)
        assert _loop_pinned()
    finally:
        procs.stop().get(timeout=60)


def test_a_proc_started_while_the_loop_is_pinned_gets_the_process_cpus() -> None:
    """Procs started by this process's agent on its pinned loop (a ``Popen`` from there,
    ``fork_procs`` off) and forked by the zygote both get the spawner's CPUs."""
    warm = this_host().spawn_procs(per_host={"procs": 1})
    try:
        actor = warm.spawn("masks", Masks)
        for _ in range(200):
            actor.ping.call_one().get(timeout=60)
        assert _loop_pinned()
        for forked in (False, True):
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
