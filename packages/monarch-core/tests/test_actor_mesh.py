"""Actors on real worker processes: spawning, the adverbs, errors, ordering, futures."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from monarch.actor import (
    Actor,
    ActorError,
    Future,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    ValueMesh,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    this_host,
    this_proc,
)
from monarch.config import configure


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by

    @endpoint
    def get(self) -> int:
        return self.value

    @endpoint
    def whoami(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "rank": dict(current_rank()),
            "size": current_size(),
            "name": current_actor_name(),
            "spawn_rank": dict(context().actor_instance.rank),
            "class_name": context().actor_instance.class_name,
            "creator": context().actor_instance.creator,
            "proc": repr(context().actor_instance.proc),
        }

    @endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    def echo(self, value: Any) -> Any:
        return value

    @endpoint
    def unpicklable_result(self) -> Any:
        return threading.Lock()

    @endpoint
    def nap(self, seconds: float) -> int:
        threading.Event().wait(seconds)
        return self.value

    @endpoint
    def die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    def call_other(self, other: Any) -> list[int]:
        values: list[int] = other.get.call().get().values()
        return sorted(values)


class AsyncCounter(Actor):
    def __init__(self) -> None:
        self.value = 0

    @endpoint
    async def incr(self) -> int:
        await asyncio.sleep(0)
        self.value += 1
        return self.value

    @endpoint
    async def ask(self, other: Any) -> int:
        return int(await other.get.call_one())


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=30)


def test_seed_example_runs_unchanged(procs: ProcMesh) -> None:
    class Trainer(Actor):
        @endpoint
        def train(self, step: int) -> int:
            return step * 10

    trainers = procs.spawn("trainers", Trainer)
    result = trainers.train.call(step=3).get()
    assert isinstance(result, ValueMesh)
    assert result.values() == [30, 30]


def test_each_actor_has_its_rank_and_process(procs: ProcMesh) -> None:
    counters = procs.spawn("ranks", Counter)
    info = counters.whoami.call().get()
    assert [v["rank"] for v in info.values()] == [{"gpus": 0}, {"gpus": 1}]
    assert [v["size"] for v in info.values()] == [{"gpus": 2}, {"gpus": 2}]
    assert {v["class_name"] for v in info.values()} == {f"{Counter.__module__}.Counter"}
    assert {v["creator"] for v in info.values()} == {context().actor_instance.proc_id}
    assert {v["proc"] for v in info.values()} == {"<ProcMesh {}>"}
    pids = {v["pid"] for v in info.values()}
    assert len(pids) == 2 and os.getpid() not in pids
    # A slice renumbers message ranks but not spawn ranks.
    one = counters.slice(gpus=1).whoami.call_one().get()
    assert one["rank"] == {} and one["spawn_rank"] == {"gpus": 1}


def test_adverbs(procs: ProcMesh) -> None:
    counters = procs.spawn("adverbs", Counter, 5)
    counters.incr.broadcast(2)
    assert counters.get.call().get().values() == [7, 7]  # FIFO: the broadcast ran first
    assert counters.slice(gpus=0).get.call_one().get() == 7
    assert counters.get.choose().get() == 7
    streamed = [f.get() for f in counters.get.stream()]
    assert streamed == [7, 7]
    with pytest.raises(ValueError, match="call_one requires exactly 1 actor, but mesh has 2"):
        counters.get.call_one()


def test_messages_from_one_sender_arrive_in_order(procs: ProcMesh) -> None:
    counters = procs.spawn("order", Counter)
    futures = [counters.echo.call(i) for i in range(50)]
    for _ in range(100):
        counters.incr.broadcast()
    assert [f.get().values() for f in futures] == [[i, i] for i in range(50)]
    assert counters.get.call().get().values() == [100, 100]


def test_endpoint_error_is_an_actor_error_and_the_actor_lives(procs: ProcMesh) -> None:
    counters = procs.spawn("errors", Counter)
    with pytest.raises(ActorError) as info:
        counters.fail.call("boom").get()
    assert isinstance(info.value.exception, ValueError)
    assert "boom" in str(info.value) and "in fail" in info.value.exception_formatted
    assert counters.get.call().get().values() == [0, 0]


def test_bad_calls_fail_at_the_call_site(procs: ProcMesh) -> None:
    counters = procs.spawn("badcalls", Counter)
    with pytest.raises(TypeError, match=r"incr\(\) is called through an adverb"):
        counters.incr(1)
    with pytest.raises(TypeError, match="incr"):
        counters.incr.call(1, 2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        counters.get.call(nope=1)
    # A misspelled keyword is named, not hidden behind the parameter it left missing.
    misspelled = r"echo\(\) got an unexpected keyword argument 'valeu' \(did you mean 'value'\?\)"
    with pytest.raises(TypeError, match=misspelled):
        counters.echo.call(valeu=1)
    with pytest.raises(TypeError):
        counters.echo.call(threading.Lock())
    with pytest.raises(AttributeError):
        counters.no_such_endpoint
    with pytest.raises(ActorError, match="pickle"):
        counters.unpicklable_result.call().get()


def test_mixed_sync_and_async_endpoints_are_refused_at_spawn(procs: ProcMesh) -> None:
    class Mixed(Actor):
        @endpoint
        def a(self) -> None: ...

        @endpoint
        async def b(self) -> None: ...

    with pytest.raises(ValueError, match="mixes both async and sync endpoints"):
        procs.spawn("mixed", Mixed)
    with pytest.raises(ValueError, match="not an Actor"):
        procs.spawn("nope", dict)


class ActorsHere(Actor):
    @endpoint
    def names(self) -> list[str]:
        from monarch.core import current_runtime

        return sorted(current_runtime().actors)


def test_an_endpoint_named_like_a_mesh_attribute_is_refused_before_spawning(
    procs: ProcMesh,
) -> None:
    class Colliding(Actor):
        @endpoint
        def stop(self) -> None: ...

    with pytest.raises(ValueError, match="'stop' of Colliding collides"):
        procs.spawn("colliding", Colliding)
    # Spawns reach a proc in order: had the refused one been sent, it would be there.
    names = procs.spawn("here", ActorsHere).names.call().get(30)
    assert not any(name.startswith("colliding") for each in names.values() for name in each)
    assert all(any(name.startswith("here") for name in each) for each in names.values())


def test_async_actor_and_meshes_as_arguments(procs: ProcMesh) -> None:
    counters = procs.spawn("target", Counter, 42)
    asks = procs.spawn("asker", AsyncCounter)
    assert asks.incr.call().get().values() == [1, 1]
    assert asks.slice(gpus=0).ask.call_one(counters.slice(gpus=1)).get() == 42
    sync_caller = procs.spawn("caller", Counter)
    assert sync_caller.call_other.call(counters).get().values() == [[42, 42], [42, 42]]


def test_nested_spawning_from_inside_an_actor(procs: ProcMesh) -> None:
    class Parent(Actor):
        @endpoint
        def spawn_children(self) -> list[int]:
            children = this_host().spawn_procs(per_host={"kids": 2})
            kids = children.spawn("kids", Counter, 7)
            values: list[int] = kids.get.call().get().values()
            children.stop().get()
            return values

    parents = procs.slice(gpus=0).spawn("parent", Parent)
    assert parents.spawn_children.call_one().get(timeout=60) == [7, 7]


def test_this_proc_spawns_in_the_callers_process() -> None:
    local = this_proc().spawn("local", Counter)
    assert local.whoami.call_one().get()["pid"] == os.getpid()


def test_a_killed_proc_fails_pending_and_later_calls() -> None:
    doomed = this_host().spawn_procs(per_host={"gpus": 1})
    victim = doomed.spawn("victim", Counter)
    assert victim.get.call_one().get() == 0
    with pytest.raises(SupervisionError, match="have failed"):
        victim.die.call_one().get(timeout=30)
    with pytest.raises(SupervisionError):
        victim.get.call_one().get(timeout=30)


def test_proc_mesh_stop_ends_the_processes() -> None:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    pids = mesh.spawn("c", Counter).whoami.call().get().values()
    mesh.stop().get(timeout=30)
    for pid in (p["pid"] for p in pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="stopped"):
        mesh.spawn("again", Counter)


def test_future_api(procs: ProcMesh) -> None:
    counters = procs.spawn("futures", Counter)
    future = counters.get.call()
    assert isinstance(future, Future)
    assert future.result(timeout=30).values() == [0, 0]
    assert future.get().values() == [0, 0]  # re-readable
    assert counters.fail.call("x").exception(timeout=30) is not None
    with pytest.raises(TypeError):
        Future()

    class Slow(Actor):
        @endpoint
        def wait(self, event_path: str) -> str:
            return "done"

    slow = procs.slice(gpus=0).spawn("slow", Slow)
    blocked = slow.wait.call_one("x")
    assert blocked.get(timeout=30) == "done"


def test_futures_can_be_awaited_from_the_users_asyncio_loop(procs: ProcMesh) -> None:
    counters = procs.spawn("awaited", Counter, 3)

    async def main() -> list[int]:
        values = await counters.get.call()
        one = await counters.slice(gpus=1).get.call_one()
        return [*values.values(), one]

    assert asyncio.run(main()) == [3, 3, 3]


def test_get_with_timeout_raises_timeout_error_and_keeps_running(procs: ProcMesh) -> None:
    class Sleeper(Actor):
        @endpoint
        def nap(self, seconds: float) -> str:
            threading.Event().wait(seconds)
            return "rested"

    sleeper = procs.slice(gpus=0).spawn("sleeper", Sleeper)
    future = sleeper.nap.call_one(0.5)
    with pytest.raises(TimeoutError):
        future.get(timeout=0.01)
    assert future.get(timeout=30) == "rested"


def test_the_job_secret_never_appears_on_a_command_line(procs: ProcMesh) -> None:
    from monarch.core import current_runtime

    secret = current_runtime().secret.hex()
    info = procs.spawn("cmdline", Counter).whoami.call().get().values()
    for pid in (v["pid"] for v in info):
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            assert secret.encode() not in cmdline.read()
        # A proc forked by its agent's zygote (fork_procs) gets it in the fork request:
        # its /proc environ (the zygote's, as it started) does not show it either.
        with open(f"/proc/{pid}/environ", "rb") as environ:
            assert secret.encode() not in environ.read()


def test_subprocesses_of_actors_and_of_the_client_do_not_inherit_the_job_secret(
    procs: ProcMesh,
) -> None:
    class Starter(Actor):
        @endpoint
        def child_sees(self) -> tuple[str | None, str]:
            seen = subprocess.run(
                [sys.executable, "-c", "import os; print(os.environ.get('MONARCH_JOB_SECRET'))"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
            return os.environ.get("MONARCH_JOB_SECRET"), seen

    seen = procs.spawn("starter", Starter).child_sees.call().get(timeout=60).values()
    assert list(seen) == [(None, "None")] * len(seen)
    assert os.environ.get("MONARCH_JOB_SECRET") is None


def test_a_worker_keeps_its_boot_heap_out_of_the_collectors_sight(procs: ProcMesh) -> None:
    """What booting made is frozen (``gc.freeze``): a full collection in a worker walks
    what its actors made, not every module object; what they make is still collected."""

    class Heap(Actor):
        @endpoint
        def collect_a_cycle(self) -> tuple[int, int]:
            import gc
            import weakref

            class Node:
                pass

            node = Node()
            node.self = node  # type: ignore[attr-defined]
            alive = weakref.ref(node)
            del node
            gc.collect()
            return gc.get_freeze_count(), alive() is None

    frozen, collected = procs.slice(gpus=0).spawn("heap", Heap).collect_a_cycle.call_one().get()
    assert frozen > 1000  # the modules and the runtime, at least
    assert collected


def test_host_meshes_travel_in_messages(procs: ProcMesh) -> None:
    class Spawner(Actor):
        @endpoint
        def spawn_on(self, hosts: Any) -> int:
            mesh = hosts.spawn_procs(per_host={"gpus": 1})
            value: int = mesh.spawn("c", Counter, 9).get.call_one().get()
            mesh.stop().get()
            return value

    spawner = procs.slice(gpus=0).spawn("hostspawner", Spawner)
    assert spawner.spawn_on.call_one(this_host()).get(timeout=60) == 9


def test_with_python_executable_runs_procs_with_that_python(tmp_path: Any) -> None:
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nMONARCH_TEST_WRAPPED=yes exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)

    class Env(Actor):
        @endpoint
        def wrapped(self) -> str | None:
            return os.environ.get("MONARCH_TEST_WRAPPED")

    hosts = this_host().with_python_executable(str(wrapper))
    assert hosts.initialized.get(timeout=10) is True
    mesh = hosts.spawn_procs(per_host={"gpus": 1})
    try:
        assert mesh.spawn("env", Env).wrapped.call_one().get(timeout=30) == "yes"
    finally:
        mesh.stop().get(timeout=30)


def test_blocking_get_inside_a_running_event_loop_warns(procs: ProcMesh) -> None:
    counters = procs.spawn("warned", Counter)

    async def main() -> int:
        with pytest.warns(UserWarning, match=r"use as_asyncio\(\) \(or await\) instead"):
            # Still running when get() is called: the actor naps first.
            value: int = counters.slice(gpus=0).nap.call_one(0.3).get(timeout=30)
        return value

    assert asyncio.run(main()) == 0


def _gate_imports_at(path: str) -> None:
    os.environ["MONARCH_TEST_IMPORT_GATE"] = path


@contextlib.contextmanager
def gated_proc(
    tmp_path: Any, bootstrap: Callable[[str], None] = _gate_imports_at
) -> Iterator[tuple[ProcMesh, Callable[[], None]]]:
    """One proc whose import of ``gated_import`` waits on a FIFO (``bootstrap`` names it
    to the proc) until ``release()``; released and stopped at the end, whatever happened."""
    gate = str(tmp_path / "gate")
    os.mkfifo(gate)
    bootstrap_here = functools.partial(bootstrap, gate)
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=bootstrap_here)
    opened = -1

    def release() -> None:
        nonlocal opened
        if opened < 0:
            opened = os.open(gate, os.O_RDWR)  # never blocks; the byte lets the import go on
            os.write(opened, b"x")

    try:
        yield procs, release
    finally:
        release()
        procs.stop().get(timeout=30)
        os.close(opened)


def test_an_actor_module_slow_to_import_holds_up_nothing_else_in_its_proc(
    tmp_path: Any,
) -> None:
    """Reading a spawn may import the actor's module (torch: seconds, tens on a busy
    machine): meanwhile the proc's loop serves its other actors (and, between machines,
    sends the heartbeats without which its peers would declare it dead)."""
    with gated_proc(tmp_path) as (procs, release):
        from gated_import import Gated  # here only: the procs import it when told to wait

        gated = procs.spawn("gated", Gated)
        counter = procs.spawn("counter", Counter, 7)
        assert counter.get.call_one().get(timeout=60) == 7  # while Gated's import waits
        release()
        assert gated.ping.call_one().get(timeout=60) == "imported"


EARLY_REFUSAL = 0.2
"""A proc's ``message_delivery_timeout`` below: how long a message for an actor it does
not have waits for the actor's spawn before it is refused."""


def _gate_imports_and_refuse_early_at(path: str) -> None:
    _gate_imports_at(path)
    configure(message_delivery_timeout=f"{EARLY_REFUSAL * 1000:.0f}ms")


def test_calls_that_reach_a_proc_while_it_reads_their_actors_spawn_wait_for_it(
    tmp_path: Any,
) -> None:
    """The spawn came first but is still being read (the actor's module imports torch: tens
    of seconds on a loaded machine, past ``message_delivery_timeout``): the calls that
    follow it wait for the actor and reach it in order, instead of failing as calls for an
    actor "never spawned or gone" (seen as ``bench:tensor``'s and the parameter server's
    first call failing under load)."""
    with gated_proc(tmp_path, _gate_imports_and_refuse_early_at) as (procs, release):
        from gated_import import Gated  # here only: the procs import it when told to wait

        gated = procs.spawn("gated", Gated)
        calls = [gated.number.call_one() for _ in range(5)]
        with pytest.raises(TimeoutError):  # not refused: waiting, 10 times the refusal's delay
            calls[0].get(timeout=10 * EARLY_REFUSAL)
        release()
        assert [call.get(timeout=60) for call in calls] == list(range(5))


def _exit_at_import() -> None:
    os.environ["MONARCH_TEST_EXIT_AT_IMPORT"] = "1"


def test_an_actor_module_that_exits_at_import_fails_the_actor_instead_of_hanging(
    unhandled_failures: list[MeshFailure],
) -> None:
    """``sys.exit()`` in the actor's module, run as the proc reads the spawn: upstream fails
    the actor with the ``SystemExit`` (its calls raise ``SupervisionError``). The thread
    reading the spawn ended silently on it, and the mesh's calls waited for the actor
    forever (a ``SystemExit`` is no ``Exception``)."""
    procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_exit_at_import)
    try:
        from exiting_import import Quits  # here only: the procs exit when they import it

        quits = procs.spawn("quits", Quits)
        for _ in range(2):  # the call at once, and one after the failure is known
            with pytest.raises(SupervisionError, match="SystemExit: 3"):
                quits.ping.call_one().get(timeout=30)
        assert [f for f in unhandled_failures if "quits" in str(f)]
    finally:
        procs.stop().get(timeout=30)


class Frame:
    """A value whose pickle hands its (writable) memory out of band, as an array's does."""

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return Frame, (pickle.PickleBuffer(self.data),)


class Holder(Actor):
    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def ends(self, *values: Any) -> list[tuple[int, int]]:
        return [(bytes(v)[0], bytes(v)[-1]) for v in (getattr(v, "data", v) for v in values)]


def test_a_buffer_changed_after_the_call_arrives_as_it_was_at_the_call() -> None:
    """Upstream pickles a call's arguments at the call; ours write large buffers out of
    band, later (a busy peer) or lent to the reader: a buffer the caller may change (a
    bytearray, an array's memory) is copied at the call, so what arrives is what was sent."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    holder = procs.spawn("holder", Holder)
    pid = holder.pid.call_one().get(timeout=60)
    os.kill(pid, signal.SIGSTOP)  # a busy peer: nothing of the call is read until it goes on
    try:
        size = 64 << 20  # lent, and more than a ring carries while nobody takes it out
        buffer, frame = bytearray(size), Frame(bytearray(size))
        arrived = holder.ends.call_one(buffer, frame)
        for data in (buffer, frame.data):
            data[0] = data[-1] = 7
        os.kill(pid, signal.SIGCONT)
        assert arrived.get(timeout=60) == [(0, 0), (0, 0)]
    finally:
        os.kill(pid, signal.SIGCONT)
        procs.stop().get(timeout=30)


def test_actors_spawned_on_a_slice_stop_with_the_mesh(
    unhandled_failures: list[MeshFailure],
) -> None:
    """Their procs going away when the owner stops is no failure: they are stopped first,
    as the owner's own actors are (they reached the unhandled fault hook, which ends a
    client by default)."""
    mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    row = mesh.slice(hosts=1).slice(gpus=slice(0, 2))
    counters = row.spawn("on_a_slice", Counter)
    assert counters.get.call().get(timeout=30).values() == [0, 0]
    mesh.stop().get(timeout=30)
    with pytest.raises(SupervisionError, match="stopped by client"):
        counters.get.call().get(timeout=30)
    assert not [f for f in unhandled_failures if "on_a_slice" in str(f)]


def test_mesh_stopped_says_why_once_stopped(procs: ProcMesh) -> None:
    from monarch.core import mesh_stopped

    counters = procs.spawn("stopped_check", Counter)
    assert mesh_stopped(counters) is None
    counters.stop().get(timeout=30)
    assert mesh_stopped(counters) == "ActorMeshController received explicit stop request"
