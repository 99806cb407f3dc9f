"""The co-location prototype of session 45, for ``benchmarks/placement_bench.py
--placements follow`` (kept with the core's tests: it patches the core's internals, which
only the core's own code and tests may touch).

Imported by the benchmark's client and preloaded into the zygote (``proc_preload``), it
patches the core so that a process's runtime loop thread keeps to the CPU of the thread
it serves: the thread that waits (an idle actor pool thread, a thread blocked on a
Future) notes its CPU; the loop, as it ends a batch of messages, pins itself there, and
does not spin after messages (the waiter is then the only runnable thread on that CPU, and
the load balancer leaves it). Pool threads, started by the pinned loop, unpin themselves.
Active where ``MONARCH_BENCH_FOLLOW=1`` is in the environment (read at each use: the
benchmark sets it in its client for that placement, and in its procs by their bootstrap,
``enable``). An experiment, not the runtime's behaviour: a pinned loop hands its mask to
every thread and process started from it (see the benchmarks README, session 45).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from monarch.core._mesh import _future
from monarch.core._runner import _pool
from monarch.core._runtime import _router

ENV = "MONARCH_BENCH_FOLLOW"
_getcpu = ctypes.CDLL(None).sched_getcpu
_all = frozenset(os.sched_getaffinity(0))
_state = {"waiter": -1, "pinned": -1}


def enable() -> None:
    """A proc's bootstrap (``spawn_procs(bootstrap=enable)``): the prototype on, here."""
    os.environ[ENV] = "1"


def _active() -> bool:
    return os.environ.get(ENV) == "1"


def _waiting() -> None:
    if _active():
        _state["waiter"] = _getcpu()


_wait_for_work = _pool.ActorPool._wait_for_work
_work = _pool.ActorPool._work
_outcome_wait = _future.Outcome._wait
_end_batch = _router.Runtime._end_batch
_stay_awake = _router.Runtime._stay_awake


def wait_for_work(self: Any) -> Any:
    _waiting()
    return _wait_for_work(self)


def work(self: Any) -> None:
    if _active():
        os.sched_setaffinity(0, _all)  # started by a pinned loop: not pinned itself
    _work(self)


def outcome_wait(self: Any, timeout: float | None = None) -> Any:
    _waiting()
    return _outcome_wait(self, timeout)


def end_batch(self: Any) -> None:
    _end_batch(self)
    cpu = _state["waiter"]
    if _active() and cpu >= 0 and cpu != _state["pinned"]:
        os.sched_setaffinity(0, {cpu})
        _state["pinned"] = cpu


def stay_awake(self: Any) -> None:
    if not _active():
        _stay_awake(self)


_pool.ActorPool._wait_for_work = wait_for_work  # type: ignore[method-assign]
_pool.ActorPool._work = work  # type: ignore[method-assign]
_future.Outcome._wait = outcome_wait  # type: ignore[method-assign]
_router.Runtime._end_batch = end_batch  # type: ignore[method-assign]
_router.Runtime._stay_awake = stay_awake  # type: ignore[method-assign]
