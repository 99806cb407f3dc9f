"""Sync actors: a thread each for a process's first ``sync_actor_threads``, then one
bounded pool shared by the others.

The pool's rules, first on an ``ActorPool`` of its own (many interleavings, fast), then
on real procs: the first actors keep their own thread (thread-local state, as upstream),
and it serves the next actor when one exits; each actor's messages in the order sent, at
most the pool's size of them blocked at once (the others wait), a wait on a Future taking
no place (actors calling each other in one process do not deadlock), and a proc of 200
actors answering each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import Actor, ActorMesh, ProcMesh, endpoint, this_host
from monarch.config import configured
from monarch.core import inspect_proc, spawned_procs
from monarch.core._config import current_config
from monarch.core._runner._pool import ActorPool
from monarch.core.testing import wait_until

POOL = 2
"""Threads of the procs' pool here: fewer than the actors of a proc (worker0 and worker1,
spawned first, have a thread of their own; worker2..5 share a pool of two)."""


# -- the pool alone ------------------------------------------------------------------------


class Recorder:
    """An actor as the pool sees it (``_pool.Served``): its messages are numbers, and it
    records which it handled and how many of the pool's threads ran actors at once."""

    def __init__(self, pool: ActorPool, running: list[int], most: list[int]) -> None:
        self.pool = pool
        self.scheduled = False
        self.thread_name = "recorder"
        self.calls: deque[int] = deque()
        self.seen: list[int] = []
        self.running, self.most = running, most
        self.inside = 0
        self.overlaps = 0
        """Times two threads ran this actor at once (the pool must make it 0)."""

    def put(self, value: int) -> None:
        with self.pool.lock:
            self.calls.append(value)
            if not self.scheduled:
                self.pool.schedule(self)

    def has_work(self) -> bool:
        return bool(self.calls)

    def serve(self, batch: int) -> None:
        self.inside += 1
        if self.inside != 1:
            self.overlaps += 1
        with self.pool.lock:
            self.running[0] += 1
            self.most[0] = max(self.most[0], self.running[0])
        for _ in range(batch):
            with self.pool.lock:
                if not self.calls:
                    break
                value = self.calls.popleft()
            self.seen.append(value)
            if value % 7 == 0:
                time.sleep(0)  # let another thread in
        with self.pool.lock:
            self.running[0] -= 1
        self.inside -= 1


@settings(max_examples=30, deadline=None)
@given(
    size=st.integers(1, 4),
    sends=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2)), min_size=1, max_size=200),
)
def test_each_actor_keeps_its_order_and_the_pool_its_size(
    size: int, sends: list[tuple[int, int]]
) -> None:
    """Ten actors, three sending threads: each actor sees each sender's messages in the
    order sent, every message once, and never more than ``size`` actors run at once."""
    pool = ActorPool(size, "test-pool")
    running, most = [0], [0]
    actors = [Recorder(pool, running, most) for _ in range(10)]
    by_sender: dict[int, list[tuple[int, int]]] = {}
    for n, (target, sender) in enumerate(sends):
        by_sender.setdefault(sender, []).append((target, n))

    def send(mine: list[tuple[int, int]]) -> None:
        for target, n in mine:
            actors[target].put(n)

    threads = [threading.Thread(target=send, args=(m,)) for m in by_sender.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wait_until(lambda: sum(len(a.seen) for a in actors) == len(sends), 30, "every message handled")
    for index, actor in enumerate(actors):
        assert sorted(actor.seen) == [n for n, (a, _) in enumerate(sends) if a == index]
        for mine in by_sender.values():
            sent = [n for a, n in mine if a == index]
            assert [n for n in actor.seen if n in set(sent)] == sent
    assert 1 <= most[0] <= size and pool.threads <= size
    assert [a.overlaps for a in actors] == [0] * 10


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        ActorPool(0)


# -- real procs -----------------------------------------------------------------------------


class Worker(Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def note(self, value: int) -> None:
        self.seen.append(value)

    @endpoint
    def notes(self) -> list[int]:
        return self.seen

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def ident(self) -> int:
        return threading.get_ident()

    @endpoint
    def pool_size(self) -> int:
        return current_config().sync_actor_threads

    @endpoint
    def wait(self, gate: str) -> str:
        """Blocked (not on a Future) until the file ``gate`` exists."""
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "opened"

    @endpoint
    def ask(self, other: Any) -> str:
        """Wait on a Future for another actor of this process."""
        got: str = other.ping.call_one().get(timeout=60)
        return f"it said {got}"


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    with configured(sync_actor_threads=POOL):  # the procs read it as they start
        mesh = this_host().spawn_procs(per_host={"gpus": 1}, name="pooled")
        yield mesh
        mesh.stop().get(timeout=60)


@pytest.fixture(scope="module")
def workers(procs: ProcMesh) -> list[ActorMesh[Worker]]:
    meshes = []
    for i in range(6):  # one after the other: the first two spawned have their own thread
        meshes.append(procs.spawn(f"worker{i}", Worker))
        assert meshes[-1].pool_size.call_one().get(timeout=60) == POOL
    return meshes


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60))
def test_random_interleavings_keep_each_actors_order(
    workers: list[ActorMesh[Worker]], targets: list[int]
) -> None:
    """Six actors (two with their own thread, four on a pool of two): calls sent to them in
    any interleaving reach each in the order sent."""
    before = [len(w.notes.call_one().get(timeout=60)) for w in workers]
    for n, target in enumerate(targets):
        workers[target].note.broadcast(n)
    for index, worker in enumerate(workers):
        got = worker.notes.call_one().get(timeout=60)[before[index] :]
        assert got == [n for n, t in enumerate(targets) if t == index]


def actor_state(procs: ProcMesh, mesh: str) -> Any:
    [proc] = [p for p in spawned_procs() if p.mesh == "pooled"]
    assert proc.address is not None
    snap = inspect_proc(proc.address).get(timeout=30)
    [actor] = [a for a in snap.actors if a.mesh == mesh]
    return actor


def test_blocked_endpoints_hold_the_pool_up_to_its_size(
    procs: ProcMesh, workers: list[ActorMesh[Worker]], tmp_path: Path
) -> None:
    """One blocked endpoint of the shared pool leaves a thread to the others; ``POOL`` of
    them leave none (documented): a call to a third actor of the pool waits, queued, until
    one opens, while an actor with a thread of its own still answers."""
    gates = [tmp_path / "gate0", tmp_path / "gate1"]
    first = workers[2].wait.call_one(str(gates[0]))
    wait_until(lambda: actor_state(procs, "worker2").current == "wait", 30, "worker2 waits")
    assert workers[4].ping.call_one().get(timeout=60) == "pong"  # a thread was free
    second = workers[3].wait.call_one(str(gates[1]))
    wait_until(lambda: actor_state(procs, "worker3").current == "wait", 30, "worker3 waits")
    third = workers[4].ping.call_one()
    wait_until(lambda: actor_state(procs, "worker4").queued == 1, 30, "worker4's call queued")
    assert not third.done() and actor_state(procs, "worker4").current == ""
    assert workers[0].ping.call_one().get(timeout=60) == "pong"  # its own thread
    gates[0].touch()
    assert third.get(timeout=60) == "pong"
    assert first.get(timeout=60) == "opened"
    gates[1].touch()
    assert second.get(timeout=60) == "opened"


def test_a_wait_on_a_future_takes_no_place(workers: list[ActorMesh[Worker]]) -> None:
    """Actors asking each other in a chain, in one process, beyond the pool's size: each
    one asleep on a Future lets the next run."""
    shared = workers[2:]  # three of them waiting at once on a pool of two; not a circle
    chain = [w.ask.call_one(shared[i + 1]) for i, w in enumerate(shared[:3])]
    assert [f.get(timeout=60) for f in chain] == ["it said pong"] * 3


def test_the_first_actors_keep_their_own_thread(workers: list[ActorMesh[Worker]]) -> None:
    """As upstream: thread-local state set by one endpoint of worker0 is seen by the next,
    whatever ran between (other actors, a wait on a Future)."""
    first = workers[0].ident.call_one().get(timeout=60)
    assert first != workers[1].ident.call_one().get(timeout=60)
    for other in workers[1:]:
        other.ping.broadcast()
        assert workers[0].ask.call_one(other).get(timeout=60) == "it said pong"
        assert workers[0].ident.call_one().get(timeout=60) == first


def test_an_exited_actors_own_thread_serves_the_next() -> None:
    """With ``sync_actor_threads = 1``: the first actor has a thread of its own, the second
    shares the pool; once the first is stopped, the next actor spawned gets its thread."""
    with configured(sync_actor_threads=1):  # the procs read it as they start
        procs = this_host().spawn_procs(per_host={"gpus": 1}, name="recycled")
    try:
        first = procs.spawn("first", Worker)
        own = first.ident.call_one().get(timeout=60)
        second = procs.spawn("second", Worker)
        assert second.ident.call_one().get(timeout=60) != own
        first.stop().get(timeout=60)
        third = procs.spawn("third", Worker)
        assert third.ident.call_one().get(timeout=60) == own
        assert second.ident.call_one().get(timeout=60) != own
    finally:
        procs.stop().get(timeout=60)


HUNDREDS = 200
"""Actors of one proc in the CI-sized test (issue 34's 10,000 is bench:scale's)."""


def test_a_proc_of_200_actors_answers_a_gathered_cast_on_each() -> None:
    """200 sync actors on each of two procs (200 meshes): every mesh answers a gathered
    cast, and each proc runs them on 4 threads of their own and a pool of 4."""
    with configured(sync_actor_threads=4):  # the procs read it as they start
        procs = this_host().spawn_procs(per_host={"gpus": 2}, name="crowded")
        first = procs.spawn("crowd0", Worker)
        assert first.pool_size.call().get(timeout=120).values() == [4, 4]
    try:
        before = [inspect_proc(a).get(timeout=30).threads for a in crowded()]
        meshes = [first] + [procs.spawn(f"crowd{i}", Worker) for i in range(1, HUNDREDS)]
        casts = [m.ping.call() for m in meshes]
        for cast in casts:
            assert list(cast.get(timeout=120).values()) == ["pong", "pong"]
        for address, threads in zip(crowded(), before, strict=True):
            snap = inspect_proc(address).get(timeout=30)
            assert len([a for a in snap.actors if a.mesh.startswith("crowd")]) == HUNDREDS

            def bounded(address: str = address, threads: int = threads) -> bool:
                return inspect_proc(address).get(timeout=30).threads <= threads + 3 + 4

            # the first 4 actors' own threads (one was there before) and the pool's 4,
            # whatever the count (a spawn's reading thread may still be ending)
            wait_until(bounded, 30, "no more threads than 3 own and the pool's 4 besides")
    finally:
        procs.stop().get(timeout=120)


def crowded() -> list[str]:
    """The addresses of the procs of the 200-actor test, by rank."""
    procs = sorted((p for p in spawned_procs() if p.mesh == "crowded"), key=lambda p: p.rank)
    return [p.address for p in procs if p.address is not None]


# -- a process at its limit of threads -----------------------------------------------------


def _pids_cgroup() -> Path | None:
    """A new pids cgroup (v1, or v2 where the root delegates the controller), or None."""
    name = f"monarch-test-{os.getpid()}-{time.monotonic_ns()}"
    v2 = Path("/sys/fs/cgroup")
    for parent in (v2 / "pids", v2):
        if parent == v2 and "pids" not in _read(v2 / "cgroup.subtree_control").split():
            continue
        try:
            (parent / name).mkdir()
        except OSError:
            continue
        if (parent / name / "pids.max").exists():
            return parent / name
        (parent / name).rmdir()
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.parametrize("forward", [False, True], ids=["inherited_output", "forwarded"])
def test_actors_of_a_proc_at_its_limit_of_threads_fail_with_why_never_hang(
    forward: bool,
) -> None:
    """At each limit of tasks from one that stops the procs' start to one that lets all
    run, the call answers or fails with why, in time; never waits for its timeout (a
    pool thread that could not start left the actor unmade and its calls unanswered),
    nor reports the actor's proc as having "exited cleanly" (the spawn's reader thread
    failed, and took the proc's connection with it). With the procs' output read by the
    agent, it also reads them all from one thread, which either starts or fails the
    spawn (a thread per pipe left procs unwatched, and ``stop()`` timed out)."""
    outputs: dict[int, str] = {}
    for extra in range(4, 11):
        cgroup = _pids_cgroup()
        if cgroup is None:
            pytest.skip("no pids cgroup can be made here (root and cgroup v1 or v2 pids)")
        client = Path(__file__).with_name("thread_limit_client.py")
        try:
            done = subprocess.run(
                [sys.executable, str(client), str(cgroup), str(extra)]
                + (["forward"] if forward else []),
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            left = cgroup / "cgroup.procs"
            wait_until(lambda: not _read(left).strip(), 30, f"{left} empty")  # noqa: B023
            cgroup.rmdir()
        outputs[extra] = done.stdout
        assert done.returncode == 0, (extra, done.stdout, done.stderr[-3000:])
        assert "STOPPED" in done.stdout, (extra, done.stdout)
        out = done.stdout
        assert "ANSWER 2" in out or (
            "FAILED" in out
            and ("can't start new thread" in out or "Resource temporarily unavailable" in out)
        ), (extra, out, done.stderr[-3000:])
        assert "TimeoutError" not in out and "exited cleanly" not in out, (extra, out)
    assert any("can't start new thread" in out for out in outputs.values()), outputs
    assert "ANSWER 2" in outputs[10], outputs
