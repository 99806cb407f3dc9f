"""Ports, channels, send, Accumulator, explicit response ports, concurrent endpoints, stop."""

from __future__ import annotations

import asyncio
import os
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import (
    Accumulator,
    Actor,
    ActorError,
    Channel,
    Port,
    ProcMesh,
    SupervisionError,
    as_endpoint,
    concurrent_endpoint,
    current_rank,
    endpoint,
    send,
    this_host,
)


class Worker(Actor):
    def __init__(self, log_dir: str = "") -> None:
        self.log_dir = log_dir
        self.seen: list[int] = []

    @endpoint
    def value(self) -> int:
        return current_rank().rank + 1

    @endpoint
    def record(self, i: int) -> None:
        self.seen.append(i)

    @endpoint
    def history(self) -> list[int]:
        return self.seen

    @endpoint
    def push(self, port: Port[str], n: int) -> None:
        for i in range(n):
            port.send(f"{current_rank().rank}:{i}")

    @endpoint(explicit_response_port=True)
    def later(self, port: Port[int], x: int) -> None:
        port.send(x * 2)

    @endpoint(explicit_response_port=True)
    def refuse(self, port: Port[int]) -> None:
        port.exception(KeyError("nope"))

    @endpoint
    def fire(self) -> None:
        raise RuntimeError("broadcast failure")

    @endpoint
    def exit(self) -> None:
        raise SystemExit(3)

    def plain(self, x: int) -> int:
        return x + 100

    def __cleanup__(self, exc: Exception | None) -> None:
        if self.log_dir:
            Path(self.log_dir, f"cleanup-{os.getpid()}").write_text(repr(exc))


class BadInit(Actor):
    def __init__(self) -> None:
        raise ValueError("cannot start")

    @endpoint
    def hello(self) -> str:
        return "hi"


class Overlapping(Actor):
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.order: list[str] = []

    @concurrent_endpoint
    async def wait_for_gate(self) -> str:
        self.order.append("waiting")
        await self.gate.wait()
        return "through"

    @endpoint
    async def open_gate(self) -> list[str]:
        self.order.append("opening")
        self.gate.set()
        return self.order


class Tracked:
    """An argument whose lifetime on the receiving proc can be watched."""


_seen: dict[str, weakref.ref[Tracked]] = {}


class Taker(Actor):
    @endpoint
    def take(self, name: str, value: Tracked) -> None:
        _seen[name] = weakref.ref(value)


class Watcher(Actor):
    @endpoint
    def alive(self, name: str) -> bool:
        return _seen[name]() is not None


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=30)


def test_channel_round_trip_in_the_client() -> None:
    port, receiver = Channel[int].open()
    port.send(1)
    port.send(2)
    assert [receiver.recv().get(timeout=10), receiver.recv().get(timeout=10)] == [1, 2]
    port.exception(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):  # the exception itself, as upstream's
        receiver.recv().get(timeout=10)


def test_ports_travel_to_actors_and_keep_order(procs: ProcMesh) -> None:
    workers = procs.spawn("pushers", Worker)
    port, receiver = Channel[str].open_ranked()
    workers.push.call(port, 20).get(timeout=30)
    got = [receiver.recv().get(timeout=10) for _ in range(40)]
    for rank in (0, 1):
        mine = [value for sender, value in got if sender == rank]
        assert mine == [f"{rank}:{i}" for i in range(20)]


class Collector(Actor):
    """An async actor taking values from its own loop, several ``recv()`` asked at once."""

    def __init__(self) -> None:
        self.port, self.inbox = Channel[str].open_ranked()

    @endpoint
    async def inbox_port(self) -> Port[str]:
        return self.port

    @endpoint
    async def collect(self, count: int) -> list[tuple[int, str]]:
        got: list[tuple[int, str]] = []
        while len(got) < count:
            asked = [self.inbox.recv() for _ in range(min(7, count - len(got)))]
            for future in asked:  # some asked before their value came, some after
                got.append(await future)
            await asyncio.sleep(0)
        return got


def test_an_async_actor_takes_a_flood_from_its_own_loop_in_order(procs: ProcMesh) -> None:
    collector = procs.slice(gpus=0).spawn("collector", Collector)
    port = collector.inbox_port.call_one().get(timeout=30)
    collected = collector.collect.call_one(2 * 300)
    procs.spawn("flooders", Worker).push.call(port, 300).get(timeout=60)
    got = collected.get(timeout=60)
    for rank in (0, 1):
        assert [value for sender, value in got if sender == rank] == [
            f"{rank}:{i}" for i in range(300)
        ]


def test_send_replies_to_a_port_per_rank(procs: ProcMesh) -> None:
    workers = procs.spawn("senders", Worker)
    port, receiver = Channel[int].open_ranked()
    send(workers.value, (), {}, port=port)
    assert sorted(receiver.recv().get(timeout=10) for _ in range(2)) == [(0, 1), (1, 2)]
    send(workers.value, (), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=10)[1] in (1, 2)
    with pytest.raises(ValueError, match="selection"):
        send(workers.value, (), {}, selection="some")


def test_accumulator_folds_every_rank(procs: ProcMesh) -> None:
    workers = procs.spawn("summed", Worker)
    total = Accumulator(workers.value, 0, lambda acc, x: acc + x)
    assert total.accumulate().get(timeout=30) == 3


def test_explicit_response_port(procs: ProcMesh) -> None:
    workers = procs.spawn("explicit", Worker)
    assert workers.later.call(21).get(timeout=30).values() == [42, 42]
    with pytest.raises(KeyError, match="nope"):  # what port.exception sent, as upstream's
        workers.slice(gpus=0).refuse.call_one().get(timeout=30)


def test_as_endpoint_calls_a_plain_method(procs: ProcMesh) -> None:
    workers = procs.spawn("plain", Worker)
    with pytest.raises(RuntimeError, match="not annotated as an endpoint"):
        workers.plain(1)
    assert as_endpoint(workers.plain).call(5).get(timeout=30).values() == [105, 105]


def test_concurrent_endpoint_lets_later_messages_through(procs: ProcMesh) -> None:
    actors = procs.slice(gpus=0).spawn("overlap", Overlapping)
    waiting = actors.wait_for_gate.call_one()
    assert actors.open_gate.call_one().get(timeout=30) == ["waiting", "opening"]
    assert waiting.get(timeout=30) == "through"


def test_stop_drains_runs_cleanup_and_later_calls_fail(procs: ProcMesh) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workers = procs.spawn("stopped", Worker, tmp)
        for i in range(20):
            workers.record.broadcast(i)
        workers.stop().get(timeout=30)
        assert sorted(p.name for p in Path(tmp).iterdir()) == sorted(
            f"cleanup-{pid}" for pid in _pids(procs)
        )
        assert all(p.read_text() == "None" for p in Path(tmp).iterdir())
    with pytest.raises(SupervisionError, match="stopped"):
        workers.value.call().get(timeout=30)


def test_a_call_right_after_stop_is_refused_and_one_before_is_answered(procs: ProcMesh) -> None:
    """Program order holds whichever way a request goes (from the calling thread, or through
    the runtime loop): a call made before stop() is answered, one made after it is refused."""
    for attempt in range(20):
        workers = procs.spawn(f"late{attempt}", Worker)
        workers.value.call().get(timeout=30)  # up: calls may now go out from this thread
        before = workers.value.call()
        stopping = workers.stop()
        after = workers.value.call()
        assert len(before.get(timeout=30)) == procs.size()
        with pytest.raises(SupervisionError, match="stopped"):
            after.get(timeout=30)
        stopping.get(timeout=30)


def test_failed_init_fails_every_call(procs: ProcMesh) -> None:
    broken = procs.spawn("broken", BadInit)
    with pytest.raises(SupervisionError, match="cannot start"):
        broken.hello.call().get(timeout=30)
    assert broken.initialized.get(timeout=30) is None  # upstream's: the actors exist


def test_error_without_reply_port_fails_the_actor(procs: ProcMesh) -> None:
    workers = procs.spawn("fragile", Worker)
    workers.fire.broadcast()
    with pytest.raises(SupervisionError, match="broadcast failure"):
        workers.value.call().get(timeout=30)


def test_base_exception_fails_the_actor(procs: ProcMesh) -> None:
    workers = procs.slice(gpus=1).spawn("exiting", Worker)
    with pytest.raises(SupervisionError, match="SystemExit"):
        workers.exit.call_one().get(timeout=30)
    with pytest.raises(SupervisionError):
        workers.value.call_one().get(timeout=30)


def _pids(procs: ProcMesh) -> list[int]:
    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    values: list[int] = procs.spawn("pid", Pid).pid.call().get(timeout=30).values()
    return values


def test_ordering_holds_across_adverbs(procs: ProcMesh) -> None:
    workers = procs.spawn("ordered", Worker)
    futures: list[Any] = []
    for i in range(30):
        if i % 3 == 0:
            futures.append(workers.record.call(i))
        else:
            workers.record.broadcast(i)
    port, receiver = Channel[None].open()
    send(workers.record, (30,), {}, port=port)
    assert workers.history.call().get(timeout=30).values() == [list(range(31))] * 2
    for future in futures:
        future.get(timeout=30)
    receiver.recv().get(timeout=10)


class Registry(Actor):
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.count = 0

    @endpoint
    def visit(self) -> tuple[str, int, int]:
        self.count += 1
        return self.tag, self.count, os.getpid()


class Visitor(Actor):
    @endpoint
    def visit_registry(self) -> tuple[str, int, int]:
        from monarch.actor import get_or_spawn_controller

        registry = get_or_spawn_controller("registry", Registry, "from-actor").get()
        result: tuple[str, int, int] = registry.visit.call_one().get()
        return result


def test_get_or_spawn_controller_is_one_actor_in_the_client(procs: ProcMesh) -> None:
    from monarch.actor import get_or_spawn_controller

    first = get_or_spawn_controller("registry", Registry, "from-client").get(timeout=30)
    again = get_or_spawn_controller("registry", Registry, "ignored").get(timeout=30)
    assert first.visit.call_one().get(timeout=30) == ("from-client", 1, os.getpid())
    assert again.visit.call_one().get(timeout=30) == ("from-client", 2, os.getpid())
    visitors = procs.spawn("visitors", Visitor)
    results = visitors.visit_registry.call().get(timeout=30).values()
    assert sorted(count for _, count, _ in results) == [3, 4]
    assert {(tag, pid) for tag, _, pid in results} == {("from-client", os.getpid())}


def test_meshes_travel_in_messages(procs: ProcMesh) -> None:
    class Spawner(Actor):
        @endpoint
        def spawn_on(self, mesh: ProcMesh) -> list[int]:
            workers = mesh.spawn("remote-spawned", Worker)
            values: list[int] = workers.value.call().get().values()
            return values

    spawner = procs.slice(gpus=0).spawn("spawner", Spawner)
    assert spawner.spawn_on.call_one(procs).get(timeout=30) == [1, 2]


def test_shutdown_context_stops_spawned_procs() -> None:
    from monarch.actor import shutdown_context

    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    workers = mesh.spawn("short-lived", Worker)
    assert workers.value.call().get(timeout=30).values() == [1]
    shutdown_context().get(timeout=30)
    shutdown_context().get(timeout=30)  # idempotent
    with pytest.raises(RuntimeError, match="stopped"):
        mesh.spawn("again", Worker)


def _set_marker() -> None:
    os.environ["MONARCH_TEST_BOOTSTRAPPED"] = str(os.getpid())


def test_bootstrap_runs_on_every_proc_before_actors() -> None:
    class ReadEnv(Actor):
        def __init__(self) -> None:
            self.seen_at_init = os.environ.get("MONARCH_TEST_BOOTSTRAPPED")

        @endpoint
        def seen(self) -> tuple[str | None, int]:
            return self.seen_at_init, os.getpid()

    mesh = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=_set_marker)
    try:
        seen = mesh.spawn("env", ReadEnv).seen.call().get(timeout=30).values()
        assert [marker for marker, _ in seen] == [str(pid) for _, pid in seen]
    finally:
        mesh.stop().get(timeout=30)


def _fail_bootstrap() -> None:
    raise RuntimeError(f"no GPU here (pid {os.getpid()})")


def test_a_failing_bootstrap_fails_the_proc_mesh_and_ends_its_procs() -> None:
    mesh = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_fail_bootstrap)
    with pytest.raises(ActorError, match="no GPU here") as info:
        mesh.initialized.get(timeout=30)
    pid = int(str(info.value.exception).rsplit(" ", 1)[1].rstrip(")"))
    mesh.stop().get(timeout=30)  # returns once the procs that started have exited
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_sync_actor_lets_go_of_a_message_once_handled() -> None:
    """Its thread holds nothing of the last message while it waits for the next: a large
    argument's memory is free for reuse by then (asked from another actor of the proc)."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        taker = procs.spawn("taker", Taker)
        watcher = procs.spawn("watcher", Watcher)
        taker.take.call_one("first", Tracked()).get(timeout=30)
        assert watcher.alive.call_one("first").get(timeout=30) is False
    finally:
        procs.stop().get(timeout=30)
