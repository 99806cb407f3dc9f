"""Drop-in behaviour of actors and meshes, as upstream's: decorator misuse, ``initialized``,
actor names, ``send`` selections, blocking where upstream lets code block, ``stop``.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 to show the expectations are upstream's.
"""

from __future__ import annotations

import asyncio
import operator
import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from monarch.actor import (
    Accumulator,
    Actor,
    Channel,
    ProcMesh,
    concurrent_endpoint,
    context,
    current_actor_name,
    current_rank,
    endpoint,
    send,
    this_host,
    this_proc,
)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=60)


# -- decorators ---------------------------------------------------------------------------------


async def _async_method(self: Any) -> int:
    return 1


def _sync_method(self: Any) -> int:
    return 1


STACKED = (
    "concurrent_endpoint does not wrap @endpoint; pass endpoint options to @concurrent_endpoint"
)
NOT_ASYNC = "concurrent_endpoint can only wrap async endpoints"


@pytest.mark.parametrize(
    ("wrap", "message"),
    [
        (lambda: concurrent_endpoint(endpoint(_async_method)), STACKED),
        (lambda: concurrent_endpoint(propagate=None)(endpoint(_async_method)), STACKED),
        (lambda: concurrent_endpoint(endpoint(_sync_method)), STACKED),
        (lambda: concurrent_endpoint(_sync_method), NOT_ASYNC),
        (lambda: concurrent_endpoint(explicit_response_port=True)(_sync_method), NOT_ASYNC),
        (lambda: concurrent_endpoint(lambda self: 1), NOT_ASYNC),
    ],
)
def test_concurrent_endpoint_misuse_is_a_value_error(wrap: Any, message: str) -> None:
    with pytest.raises(ValueError, match="concurrent_endpoint") as info:
        wrap()
    assert str(info.value) == message


class StackedEndpoints(Actor):
    @endpoint
    @endpoint
    def twice(self) -> int:
        return 1


def test_endpoint_on_an_endpoint_is_taken_then_refused_at_spawn(procs: ProcMesh) -> None:
    assert type(vars(StackedEndpoints)["twice"]).__name__ == "EndpointProperty"
    with pytest.raises(TypeError, match=r"EndpointProperty object at 0x\w+> is not a callable"):
        procs.spawn("stacked", StackedEndpoints)
    assert procs.slice(gpus=0).spawn("after_stacked", Echo).echo.call_one(3).get(timeout=60) == 3


# -- meshes ---------------------------------------------------------------------------------------


def test_initialized_resolves_to_true_for_procs_and_hosts(procs: ProcMesh) -> None:
    assert procs.initialized.get(timeout=60) is True
    assert this_host().initialized.get(timeout=60) is True


class FailsInInit(Actor):
    def __init__(self) -> None:
        raise ValueError("no init for you")

    @endpoint
    def echo(self, value: int) -> int:
        return value


def test_actor_mesh_initialized_resolves_to_none_even_when_init_failed(
    procs: ProcMesh, unhandled_failures: list[Any]
) -> None:
    assert procs.spawn("init_ok", Echo).initialized.get(timeout=60) is None
    mesh = this_host().spawn_procs(per_host={"gpus": 2})  # upstream's spawns no more on it
    try:
        broken = mesh.spawn("init_fails", FailsInInit)
        assert broken.initialized.get(timeout=60) is None  # upstream's: the actors exist
        with pytest.raises(Exception, match="no init for you") as info:
            broken.echo.call(1).get(timeout=60)  # the failure is supervision's to tell
        assert type(info.value).__name__ == "SupervisionError"
        assert broken.initialized.get(timeout=60) is None  # and stays so
    finally:
        mesh.stop().get(timeout=60)


def test_stop_results_are_upstreams(procs: ProcMesh) -> None:
    echo = procs.spawn("stopped_echo", Echo)
    assert echo.echo.call(1).get(timeout=60).item(gpus=1) == 1
    assert echo.stop().get(timeout=60) == ()
    assert echo.stop().get(timeout=60) == ()  # again: nothing left to stop
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    assert mesh.spawn("stopped_with_procs", Echo).stop().get(timeout=60) == ()
    assert mesh.stop().get(timeout=60) is None
    with pytest.raises(RuntimeError, match="reference instead of owned"):
        this_host().stop().get(timeout=60)


class Named(Actor):
    @endpoint
    def names(self) -> tuple[str, str, str | None]:
        instance = context().actor_instance
        return current_actor_name(), instance.name, instance.class_name


def test_actor_names_are_unique_and_start_with_the_mesh_name(procs: ProcMesh) -> None:
    first = procs.spawn("Twin_Mesh", Named).names.call().get(timeout=60).values()
    second = procs.spawn("Twin_Mesh", Named).names.call().get(timeout=60).values()
    ids = [name for name, _, _ in first + second]
    assert len(set(ids)) == 4  # two meshes of two, one name each
    assert all(name.startswith("twin_mesh<") for name in ids)  # lower-cased, as upstream's
    assert {mesh_name for _, mesh_name, _ in first + second} == {"Twin_Mesh"}
    assert {class_name for _, _, class_name in first} == {f"{Named.__module__}.Named"}


@pytest.mark.parametrize(
    ("given", "written"),
    [("9lives", "lives"), ("My.Mesh", "mymesh"), ("a b-c_d", "ab-c_d"), ("__", "nil"), ("", "nil")],
)
def test_actor_names_spell_the_mesh_name_as_upstream(
    procs: ProcMesh, given: str, written: str
) -> None:
    name, _, _ = procs.slice(gpus=0).spawn(given, Named).names.call_one().get(timeout=60)
    assert name.startswith(f"{written}<")


def test_client_context_is_the_root() -> None:
    instance = context().actor_instance
    assert instance.name == "root"
    assert instance.class_name is None
    assert repr(instance) == "<root>"


class Shown(Actor):
    @endpoint
    def shown(self) -> str:
        return repr(context().actor_instance)


def test_an_instance_shows_as_its_name_in_supervision_texts(procs: ProcMesh) -> None:
    shown = procs.spawn("Shown_Mesh", Shown).shown.call().get(timeout=60)
    qualname = f"{Shown.__module__}.Shown"
    assert shown.item(gpus=1) == f"<root>.<{qualname} Shown_Mesh{{'gpus': 1/2}}>"


class Echo(Actor):
    @endpoint
    def echo(self, value: int) -> int:
        return value


def test_send_takes_upstreams_selection_words(procs: ProcMesh) -> None:
    echo = procs.spawn("echo", Echo)
    port, receiver = Channel[int].open()
    send(echo.echo, (7,), {}, port=port, selection="choose")
    assert receiver.recv().get(timeout=60) == 7
    for word in ("*", "?", "bogus"):
        with pytest.raises(ValueError, match="Invalid selection") as info:
            send(echo.echo, (1,), {}, port=port, selection=word)
        assert str(info.value) == f"Invalid selection: {word}"
    with pytest.raises(TypeError, match="argument 'selection': 'int' object cannot be cast"):
        send(echo.echo, (1,), {}, port=port, selection=3)  # type: ignore[arg-type]


# -- blocking where upstream lets code block ------------------------------------------------------


class Answer(Actor):
    @endpoint
    async def value(self) -> int:
        return 41


class BlocksInInit(Actor):
    """An async actor whose ``__init__`` waits for another actor, and starts a task."""

    def __init__(self, answer: Any) -> None:
        self.value: int = answer.value.call_one().get(timeout=60) + 1
        self.ticked = asyncio.Event()
        self.task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        self.ticked.set()

    @endpoint
    async def get(self) -> int:
        await asyncio.wait_for(self.ticked.wait(), 60)
        return self.value


def test_an_async_actor_may_block_on_a_future_in_init(procs: ProcMesh) -> None:
    one = procs.slice(gpus=0)
    answer = one.spawn("answer", Answer)  # on the same proc: its loop must keep serving
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # upstream warns that get() blocks a running loop
        assert one.spawn("blocks", BlocksInInit, answer).get.call_one().get(timeout=60) == 42


class BlocksInEndpoint(Actor):
    """An async actor whose endpoint blocks on a Future, as upstream's may (its own loop)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    @endpoint
    async def blocked(self) -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # upstream warns that get() blocks a running loop
            value: int = self.answer.value.call_one().get(timeout=60)
        return value + 1

    @endpoint
    async def awaited(self) -> int:
        value: int = await self.answer.value.call_one()
        return value + 2


def test_an_async_endpoint_may_block_on_a_future(procs: ProcMesh) -> None:
    one = procs.slice(gpus=0)
    answer = one.spawn("answer_blocked", Answer)  # on the same proc: it must keep serving
    blocks = one.spawn("blocks_in_endpoint", BlocksInEndpoint, answer)
    assert blocks.blocked.call_one().get(timeout=60) == 42
    assert blocks.awaited.call_one().get(timeout=60) == 43  # and await still works
    both = [blocks.blocked.call_one(), blocks.awaited.call_one(), blocks.blocked.call_one()]
    assert [future.get(timeout=60) for future in both] == [42, 43, 42]  # in order


def _bootstrap_blocking() -> None:
    helper = this_proc().spawn("bootstrap_helper", Answer)
    os.environ["DROPIN_BOOTSTRAP_ANSWER"] = str(helper.value.call_one().get(timeout=60))


class ReadsEnvironment(Actor):
    @endpoint
    def answer(self) -> str | None:
        return os.environ.get("DROPIN_BOOTSTRAP_ANSWER")


def test_a_bootstrap_may_block_on_a_future() -> None:
    mesh = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=_bootstrap_blocking)
    try:
        assert mesh.spawn("reads", ReadsEnvironment).answer.call_one().get(timeout=60) == "41"
    finally:
        mesh.stop().get(timeout=60)


def test_blocking_get_in_a_running_loop_warns_as_upstream(procs: ProcMesh) -> None:
    echo = procs.slice(gpus=0).spawn("echo_warned", Echo)

    async def main() -> list[warnings.WarningMessage]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert echo.echo.call_one(5).get() == 5  # no timeout: upstream always warns then
        return caught

    (warning,) = [w for w in asyncio.run(main()) if "Future.get()" in str(w.message)]
    assert warning.category is UserWarning
    assert str(warning.message).startswith(
        "Future.get() was called from within an active event loop."
    )


# -- streaming inside an async endpoint -----------------------------------------------------------


class Numbered(Actor):
    @endpoint
    async def value(self, base: int) -> int:
        return base + current_rank().rank


class Streams(Actor):
    def __init__(self, workers: Any) -> None:
        self.workers = workers

    @endpoint
    async def awaited(self) -> list[int]:
        return sorted([await future for future in self.workers.value.stream(10)])

    @endpoint
    async def async_for(self) -> str:
        try:
            async for _ in self.workers.value.stream(10):
                pass
        except TypeError as exc:
            return type(exc).__name__
        return "iterated"

    @endpoint
    async def other_adverbs(self) -> tuple[list[int], int, int]:
        called = sorted((await self.workers.value.call(20)).values())
        chosen: int = await self.workers.value.choose(30)
        one: int = await self.workers.slice(gpus=1).value.call_one(40)
        self.workers.value.broadcast(0)
        return called, chosen, one

    @endpoint
    async def accumulated(self) -> int:
        total: int = await Accumulator(self.workers.value, 0, operator.add).accumulate(100)
        return total


def test_stream_and_accumulate_inside_an_async_endpoint(procs: ProcMesh) -> None:
    workers = procs.spawn("numbered", Numbered)
    streams = procs.slice(gpus=0).spawn("streams", Streams, workers)
    assert streams.awaited.call_one().get(timeout=60) == [10, 11]
    assert streams.async_for.call_one().get(timeout=60) == "TypeError"  # an iterator, as upstream
    assert streams.accumulated.call_one().get(timeout=60) == 201
    called, chosen, one = streams.other_adverbs.call_one().get(timeout=60)
    assert called == [20, 21] and chosen in (30, 31) and one == 40  # rank in the slice called


# -- stopping a proc mesh -------------------------------------------------------------------------


class Recorder(Actor):
    def __init__(self) -> None:
        self.events: list[str] = []

    @endpoint
    def add(self, event: str) -> None:
        self.events.append(event)

    @endpoint
    def get(self) -> list[str]:
        return list(self.events)


class Busy(Actor):
    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder

    @concurrent_endpoint
    async def long(self) -> None:
        try:
            self.recorder.add.broadcast("started")
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            self.recorder.add.broadcast("cancelled")
            raise

    async def __cleanup__(self, exc: Exception | None) -> None:
        await asyncio.sleep(0)
        self.recorder.add.broadcast(f"cleanup {exc!r}")


def test_proc_mesh_stop_cancels_concurrent_endpoints_then_runs_async_cleanup(
    procs: ProcMesh,
) -> None:
    recorder = procs.slice(gpus=0).spawn("recorder", Recorder)
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    busy = mesh.spawn("busy", Busy, recorder)
    pending = busy.long.call_one()
    while "started" not in recorder.get.call_one().get(timeout=60):
        pass  # the body is running: ask again (each ask is a round trip, not a sleep)
    mesh.stop().get(timeout=60)
    assert recorder.get.call_one().get(timeout=60) == ["started", "cancelled", "cleanup None"]
    with pytest.raises(Exception, match="stopped by client") as info:
        pending.get(timeout=60)
    assert type(info.value).__name__ == "SupervisionError"
