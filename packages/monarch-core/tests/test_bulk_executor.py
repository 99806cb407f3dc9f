"""The process's one bulk-data executor: helpers never make it wait on itself, it knows
when its bounded lane is full (an owner then serves a pull on its loop), its urgent lane
never waits behind the bounded one, it shuts down once."""

from __future__ import annotations

import threading

import pytest

from monarch.core.lowlevel import Executor as Threads


def test_spread_finishes_on_a_full_pool_and_cancels_unstarted_helpers() -> None:
    with Threads(1) as threads:
        release = threading.Event()
        blocker = threads.submit(release.wait, 60)
        assert threads.saturated()
        work = iter(range(100))
        done: list[int] = []

        def run() -> None:
            for item in work:
                done.append(item)

        result: list[list[BaseException]] = []
        caller = threading.Thread(target=lambda: result.append(threads.spread(run, 3)))
        caller.start()
        caller.join(60)  # a pool waiting on itself would never end this
        assert not caller.is_alive() and result == [[]]
        assert sorted(done) == list(range(100))
        release.set()
        assert blocker.result(60) is True
        threads.submit(int).result(60)  # the cancelled helpers freed their places
        assert not threads.saturated()


def test_spread_reports_every_helpers_error() -> None:
    with Threads(4) as threads:
        seen = threading.Barrier(2, timeout=60)

        def run() -> None:
            seen.wait()  # the caller and one helper both ran
            raise ValueError(threading.current_thread().name)

        errors = threads.spread(run, 1)
        assert len(errors) == 2 and all(isinstance(e, ValueError) for e in errors)


def test_shutdown_happens_once_and_refuses_later_work() -> None:
    threads = Threads(2)
    threads.shutdown()
    threads.shutdown()
    with pytest.raises(RuntimeError, match="shutdown"):
        threads.submit(int)
    assert not threads.saturated()


def test_the_urgent_lane_runs_while_the_bounded_lane_is_full() -> None:
    with Threads(1) as threads:
        release = threading.Event()
        blocker = threads.submit(release.wait, 60)
        queued = threads.submit(int, 7)  # waits behind the blocker
        assert threads.saturated() and not queued.done()
        # A frame's parts are read here: the answer the blocker waits for comes behind it.
        urgent = threads.submit_urgent(release.set)
        urgent.result(60)
        assert blocker.result(60) is True
        assert queued.result(60) == 7


def test_the_bounded_lane_runs_in_order_and_frees_its_places() -> None:
    with Threads(2) as threads:
        gate = threading.Event()
        seen: list[int] = []
        blockers = [threads.submit(gate.wait, 60) for _ in range(2)]
        later = [threads.submit(seen.append, i) for i in range(20)]
        gate.set()
        assert all(blocker.result(60) for blocker in blockers)
        for future in later:
            future.result(60)
        assert sorted(seen) == list(range(20))
        assert not threads.saturated()
