"""``monarch._src.actor.mock.patch_actor``: spawns of a patched class start its mock, for
the client and for actors that spawn it, as upstream's GRPO simulation runs its RL loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from monarch._src.actor.mock import get_actor_class, patch_actor
from monarch.actor import Actor, ProcMesh, endpoint, this_host, this_proc

WAIT = 60.0


class Generator(Actor):
    """Stands for the real thing: needs a GPU and a model (here: refuses to start)."""

    def __init__(self, buffer: ReplayBuffer) -> None:
        raise RuntimeError("the real generator needs a GPU")

    @endpoint
    async def generate(self, step: int) -> None: ...


class Learner(Actor):
    def __init__(self, buffer: ReplayBuffer) -> None:
        raise RuntimeError("the real learner needs a GPU")

    @endpoint
    async def step(self) -> float:
        raise NotImplementedError


class ReplayBuffer(Actor):
    def __init__(self) -> None:
        self.items: list[float] = []

    @endpoint
    async def add(self, item: float) -> None:
        self.items.append(item)

    @endpoint
    async def sample(self) -> list[float]:
        return list(self.items)


class MockGenerator(Generator):
    def __init__(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer

    @endpoint
    async def generate(self, step: int) -> None:
        await self.buffer.add.call(float(step))


class MockLearner(Actor):
    def __init__(self, buffer: ReplayBuffer) -> None:
        self.buffer = buffer

    @endpoint
    async def step(self) -> float:
        items = await self.buffer.sample.call_one()
        return float(sum(items))


class MockLearner2(MockLearner):
    @endpoint
    async def step(self) -> float:
        return -1.0


class Spawner(Actor):
    """Spawns a ``Generator`` itself, on its own proc: the patch reaches it there."""

    @endpoint
    def spawn_and_generate(self, buffer: ReplayBuffer) -> None:
        child = this_proc().spawn("inner_generator", Generator, buffer)
        child.generate.call(7).get(timeout=WAIT)  # the real one could not start


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    yield mesh
    mesh.stop().get(timeout=WAIT)


async def rl_loop(procs: ProcMesh, steps: int) -> list[float]:
    """The shape of upstream's GRPO example: generators fill a buffer, a learner trains."""
    buffer = procs.spawn("buffer", ReplayBuffer)
    generator = procs.spawn("generator", Generator, buffer)
    learner = procs.spawn("learner", Learner, buffer)
    losses = []
    for step in range(steps):
        await generator.generate.call(step)
        losses.append(await learner.step.call_one())
    return losses


def test_patched_spawns_start_the_mocks(procs: ProcMesh) -> None:
    with patch_actor(Learner, MockLearner), patch_actor(Generator, MockGenerator):
        assert get_actor_class(Learner) is MockLearner
        assert asyncio.run(rl_loop(procs, 3)) == [0.0, 1.0, 3.0]
    assert get_actor_class(Learner) is Learner  # put back on leaving


def test_a_decorated_coroutine_runs_patched(procs: ProcMesh) -> None:
    @patch_actor(Learner, MockLearner2)
    @patch_actor(Generator, MockGenerator)
    async def simulate() -> list[float]:
        return await rl_loop(procs, 2)

    assert asyncio.run(simulate()) == [-1.0, -1.0]
    assert get_actor_class(Generator) is Generator


def test_patches_nest(procs: ProcMesh) -> None:
    with patch_actor(Learner, MockLearner):
        with patch_actor(Learner, MockLearner2):
            assert get_actor_class(Learner) is MockLearner2
        assert get_actor_class(Learner) is MockLearner
    assert get_actor_class(Learner) is Learner


def test_an_actor_spawning_a_patched_class_starts_the_mock(procs: ProcMesh) -> None:
    with patch_actor(Generator, MockGenerator):
        buffer = procs.spawn("nested_buffer", ReplayBuffer)
        spawner = procs.spawn("spawner", Spawner)
        spawner.spawn_and_generate.call_one(buffer).get(timeout=WAIT)
        assert buffer.sample.call_one().get(timeout=WAIT) == [7.0]


def test_without_the_patch_the_real_class_starts(procs: ProcMesh) -> None:
    buffer = procs.spawn("real_buffer", ReplayBuffer)
    learner = procs.spawn("real_learner", Learner, buffer)
    with pytest.raises(Exception, match="needs a GPU"):
        learner.step.call_one().get(timeout=WAIT)
