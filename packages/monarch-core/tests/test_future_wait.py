"""How waiting threads wait: a thread blocking on a Future yields the CPU a while
first, but only when the processes that must answer leave a CPU to spare; the runtime's
loop stays awake a while after it handled messages."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.config import configured
from monarch.core import Future, current_runtime, run_on
from monarch.core._runtime import USABLE_CPUS as _CPUS
from monarch.core.testing import wait_until


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


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
    monkeypatch: pytest.MonkeyPatch,
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


def test_the_loop_stays_awake_for_wait_spin_after_messages(procs: ProcMesh) -> None:
    runtime = current_runtime()
    pids = procs.spawn("awake", Pid)

    async def awake_now() -> bool:  # asked after this very request was handled
        return runtime.awake()

    with configured(wait_spin="100ms"):
        pids.pid.call().get(30)
        assert run_on(runtime, awake_now()).get(30)
        wait_until(lambda: not runtime.awake(), 30, "the loop to sleep again")
    with configured(wait_spin=0):
        pids.pid.call().get(30)
        assert not run_on(runtime, awake_now()).get(30)
