"""How waiting threads wait: a thread blocking on a Future yields the CPU a while
first, but only when the processes that must answer leave a CPU to spare; the runtime's
loop stays awake a while after it handled messages; none of them yields while the machine
has shown it has no CPU to spare (a yield handed the CPU to another process)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.config import configured
from monarch.core import Future, current_runtime, run_on
from monarch.core._config import current_config
from monarch.core._host import _spawning
from monarch.core._placement import following
from monarch.core._runtime import USABLE_CPUS as _CPUS
from monarch.core._runtime import _spin
from monarch.core.testing import wait_until


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def spare_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's machine has a CPU to spare, however busy it is: no yield, however
    long, tells this process otherwise (the tests of the waits themselves)."""
    monkeypatch.setattr(_spin, "CONTENDED_YIELD", float("inf"))
    monkeypatch.setattr(_spin, "_contended_until", 0.0)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 3})
    yield mesh
    mesh.stop().get(30)


def _yields_while_waiting(answering: int, monkeypatch: pytest.MonkeyPatch) -> int:
    yields: list[None] = []
    real = os.sched_yield
    waiter = threading.get_ident()

    def counted() -> None:
        if threading.get_ident() == waiter:  # not the loop's (see the last test)
            yields.append(None)
        real()

    monkeypatch.setattr(os, "sched_yield", counted)
    future: Future[int] = Future._new()
    future._answering = answering

    def complete_once_waited_on() -> None:
        # The waiter either yields first or goes straight to sleep on its lock: complete
        # the future only once it is doing one or the other.
        deadline = time.monotonic() + 10
        while not yields and future._waiter is None and time.monotonic() < deadline:
            time.sleep(0.001)
        future.set_result(7)

    completer = threading.Thread(target=complete_once_waited_on)
    completer.start()
    try:
        assert future.get(10) == 7
    finally:
        completer.join()
    return len(yields)


def test_a_waiter_yields_the_cpu_before_sleeping_when_one_is_spare(
    monkeypatch: pytest.MonkeyPatch, spare_cpu: None
) -> None:
    assert _yields_while_waiting(_CPUS - 1, monkeypatch) > 0


def test_a_waiter_sleeps_at_once_when_more_processes_than_cpus_must_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _yields_while_waiting(_CPUS, monkeypatch) == 0


def test_a_gathered_call_counts_the_processes_that_answer(procs: ProcMesh) -> None:
    pids = procs.spawn("pid", Pid)
    gathered = pids.pid.call()
    one = pids.slice(gpus=0).pid.call_one()
    assert len(set(gathered.get(30).values())) == 3
    assert gathered._answering == 3
    assert one._answering == 1
    assert one.get(30) in gathered.get(30).values()


def test_the_loop_stays_awake_for_wait_spin_after_messages(
    procs: ProcMesh, spare_cpu: None
) -> None:
    runtime = current_runtime()
    pids = procs.spawn("awake", Pid)

    async def awake_now() -> bool:  # asked after this very request was handled
        return runtime.awake()

    with configured(wait_spin="100ms", loop_follows_waiter=False):
        pids.pid.call().get(30)
        assert run_on(runtime, awake_now()).get(30)
        wait_until(lambda: not runtime.awake(), 30, "the loop to sleep again")
    with configured(wait_spin="100ms"):
        if following():  # a loop that follows its waiter sleeps at once instead
            pids.pid.call().get(30)
            assert not run_on(runtime, awake_now()).get(30)
    with configured(wait_spin=0):
        pids.pid.call().get(30)
        assert not run_on(runtime, awake_now()).get(30)


def _busy() -> None:
    while True:
        pass


def test_a_yield_that_gives_the_cpu_to_another_process_stops_every_waiter_yielding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This thread and a busy process on one CPU: a yield hands it that CPU for a slice
    of its own, and waiters sleep at once for ``CONTENDED_PAUSE``, then yield again."""
    monkeypatch.setattr(_spin, "_contended_until", 0.0)
    monkeypatch.setattr(_spin, "CONTENDED_PAUSE", 3.0)  # outlasts the checks, however slow
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the busy child
        try:
            os.sched_setaffinity(0, {cpu})
            _busy()
        finally:
            os._exit(0)
    try:
        os.sched_setaffinity(threading.get_native_id(), {cpu})
        assert _spin.spin_seconds() > 0
        deadline = time.monotonic() + 30
        while _spin.yield_cpu():  # until the child has the CPU when this thread yields
            assert time.monotonic() < deadline, "no yield handed the CPU to the busy child"
        assert _spin.spin_seconds() == 0
        assert _yields_while_waiting(_CPUS - 1, monkeypatch) == 0
        assert not _spin.spin(lambda: False, 10.0)  # returns at its first long yield
    finally:
        os.sched_setaffinity(threading.get_native_id(), mine)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    wait_until(lambda: _spin.spin_seconds() > 0, 30, "waiters to yield again")


class Spin(Actor):
    @endpoint
    def spin(self) -> float:
        """How long this proc's waiters spin, contention aside (see ``_spin``)."""
        return current_config().wait_spin


CROWD = _spawning.CROWDED_PER_CPU * _CPUS + 1
"""Procs that crowd this host's CPUs (17 on CI's 2)."""


@pytest.mark.skipif(CROWD > 64, reason=f"crowding this machine takes {CROWD} procs")
def test_procs_that_crowd_the_cpus_do_not_spin() -> None:
    """More procs on a host than ``CROWDED_PER_CPU`` per CPU: each yield of a spinning waiter
    returns at once and takes the CPU from a proc with work (a gathered call to 256 procs on
    2 CPUs: ~50 -> ~40 ms without their spins): their waiters do not spin. A proc mesh
    that leaves a CPU to spare spins as before, and so does one whose spawner set
    ``wait_spin``."""
    default = current_config().wait_spin
    assert default > 0 and "MONARCH_WAIT_SPIN" not in os.environ
    few = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        assert set(few.spawn("few", Spin).spin.call().get(60).values()) == {default}
    finally:
        few.stop().get(60)
    many = this_host().spawn_procs(per_host={"gpus": CROWD})
    try:
        assert set(many.spawn("many", Spin).spin.call().get(120).values()) == {0.0}
    finally:
        many.stop().get(120)
    with configured(wait_spin="200us"):  # the spawner's word wins
        many = this_host().spawn_procs(per_host={"gpus": CROWD})
        try:
            assert set(many.spawn("told", Spin).spin.call().get(120).values()) == {0.0002}
        finally:
            many.stop().get(120)
