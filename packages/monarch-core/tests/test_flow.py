"""Floods of port values: receivers keep going in bounded memory, nothing deadlocks.

Producers send to a ``Channel`` port in a tight loop (``port.send`` then ``await
asyncio.sleep(0)``), the way an RL pipeline's generators send rollouts. The receiver
must keep receiving (fair turns: reading a flood never starves the endpoint awaiting
``recv()``), its memory must stay bounded (its lanes are held while its inboxes are full)
and so must the producers' (they slow down while the receiver consumes). Backpressure
must never deadlock: replies and calls get through while a lane is held, a receiver
waiting on another inbox gets its value, and two actors flooding each other, or each
sending everything before receiving anything, both finish. Every wait has a deadline;
each scenario runs with procs on asyncio and on uvloop (``event_loop``).

The soak test runs a pipeline for thousands of steps: four generators flood a scorer,
which passes rollouts on to a reference, then to a trainer, which sends fresh weights to
one generator per step (``selection="choose"``); torch tensors when torch is importable.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from monarch.actor import Actor, Channel, Port, ProcMesh, endpoint, send, this_host
from monarch.config import configured
from monarch.core import current_runtime

MIB = 1024 * 1024
HAS_TORCH = importlib.util.find_spec("torch") is not None
"""Imported only where tensors are made: every proc imports this module (its actors)."""
RECEIVER_GROWTH = 256 * MIB
"""What a flooded receiver's RSS may grow by: its lanes' high-water marks (4 MiB each,
counted as received) with the objects that hold them, its read buffers, and much slack.
Without backpressure it grows by tens of MiB a second, for as long as the flood lasts."""
SENDER_GROWTH = 256 * MIB
"""What a producer's RSS may grow by: its lane's backlog (8 MiB before it waits) and
the objects holding it, and much slack."""
DEADLINE = 120.0
"""Seconds any one wait may take (a crawl, not a hang, would still fail it)."""


def _loops() -> list[Any]:
    has_uvloop = importlib.util.find_spec("uvloop") is not None
    skip = pytest.mark.skipif(not has_uvloop, reason="uvloop is not installed")
    return ["asyncio", pytest.param("uvloop", marks=skip)]


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def loop_kind() -> str:
    return "uvloop" if "uvloop" in type(asyncio.get_running_loop()).__module__ else "asyncio"


@pytest.fixture(params=_loops())
def event_loop_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Procs spawned in the test run this event loop (the client keeps its own)."""
    with configured(event_loop=request.param):
        yield str(request.param)


def spawn(name: str, cls: type, count: int = 1) -> tuple[ProcMesh, Any]:
    procs = this_host().spawn_procs(per_host={"procs": count})
    return procs, procs.spawn(name, cls)


# -- a flood into one inbox ------------------------------------------------------------


class Producer(Actor):
    """Floods a port from a background task until halted."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.sent = 0
        self.rss = rss()

    @endpoint
    async def flood(self, port: Port[Any], size: int) -> str:
        payload = b"x" * size

        async def run() -> None:
            while True:
                port.send(payload)
                self.sent += 1
                await asyncio.sleep(0)

        self.task = asyncio.get_running_loop().create_task(run())
        return loop_kind()

    @endpoint
    async def flood_then_send(
        self, port: Port[Any], total: int, size: int, then: Port[Any]
    ) -> None:
        """``total`` bytes to ``port``, then one value to ``then``."""
        payload = b"x" * size
        for _ in range(total // size):
            port.send(payload)
            await asyncio.sleep(0)
        then.send("after the flood")

    @endpoint
    async def ping(self) -> int:
        return self.sent

    @endpoint
    async def halt(self) -> int:
        if self.task is not None:
            self.task.cancel()
        return rss() - self.rss


class Receiver(Actor):
    def __init__(self) -> None:
        self.port, self.inbox = Channel[Any].open()
        self.rss = rss()

    @endpoint
    async def ports(self) -> Port[Any]:
        return self.port

    @endpoint
    async def receive(self, count: int) -> int:
        """Take ``count`` values; the peak growth of this process's RSS meanwhile."""
        peak = rss()
        for i in range(count):
            await self.inbox.recv()
            if i % 256 == 0:
                peak = max(peak, rss())
        return max(peak, rss()) - self.rss

    @endpoint
    async def held_lanes(self) -> int:
        """Lanes this process does not read now (its inboxes are full)."""
        return len(current_runtime()._held)

    @endpoint
    async def probe(self, producers: Any) -> int:
        """Call a producer (its reply comes on its main connection) while this inbox,
        unconsumed, has its lane held."""
        return int(await producers.slice(procs=0).ping.call_one())

    @endpoint
    async def other_inbox(self, producers: Any, total: int) -> str:
        """Wait on a second inbox whose one value comes behind ``total`` bytes of flood
        into the first, from the same producer (the same lane)."""
        port, inbox = Channel[str].open()
        producers.slice(procs=0).flood_then_send.call_one(self.port, total, 4096, port)
        return str(await inbox.recv())

    @endpoint
    async def loop_kind(self) -> str:
        return loop_kind()


def test_a_flooded_inbox_keeps_its_receiver_going_in_bounded_memory(
    event_loop_kind: str,
) -> None:
    receiver_procs, receiver = spawn("receiver", Receiver)
    producer_procs, producers = spawn("producers", Producer, 4)
    try:
        assert receiver.loop_kind.call_one().get(timeout=DEADLINE) == event_loop_kind
        port = receiver.ports.call_one().get(timeout=DEADLINE)
        kinds = producers.flood.call(port, 1024).get(timeout=DEADLINE).values()
        assert set(kinds) == {event_loop_kind}
        # Before fair turns, the receiver got a handful of values in 5 s.
        growth = receiver.receive.call_one(30_000).get(timeout=DEADLINE)
        assert growth < RECEIVER_GROWTH
        senders = producers.halt.call().get(timeout=DEADLINE).values()
        assert max(senders) < SENDER_GROWTH
    finally:
        producer_procs.stop().get(timeout=DEADLINE)
        receiver_procs.stop().get(timeout=DEADLINE)


def test_a_held_lane_holds_up_no_reply_and_no_other_inbox(event_loop_kind: str) -> None:
    """Replies travel on the main connection; a value for another inbox, behind a held
    lane, is read on for its waiting receiver."""
    receiver_procs, receiver = spawn("receiver", Receiver)
    producer_procs, producers = spawn("producers", Producer, 1)
    try:
        port = receiver.ports.call_one().get(timeout=DEADLINE)
        producers.flood.call(port, 4096).get(timeout=DEADLINE)
        deadline = time.monotonic() + DEADLINE
        while receiver.held_lanes.call_one().get(timeout=DEADLINE) == 0:  # nobody consumes
            assert time.monotonic() < deadline, "the lane was never held"
        producers.halt.call().get(timeout=DEADLINE)  # a call and its reply get through
        assert producers.ping.call_one().get(timeout=DEADLINE) > 0
        assert receiver.probe.call_one(producers).get(timeout=DEADLINE) > 0
        assert receiver.held_lanes.call_one().get(timeout=DEADLINE) == 1
        value = receiver.other_inbox.call_one(producers, 24 * MIB).get(timeout=DEADLINE)
        assert value == "after the flood"
    finally:
        producer_procs.stop().get(timeout=DEADLINE)
        receiver_procs.stop().get(timeout=DEADLINE)


# -- two actors flooding each other ----------------------------------------------------


class Peer(Actor):
    """Sends ``count`` values to another Peer's inbox and receives as many in its own."""

    def __init__(self) -> None:
        self.port, self.inbox = Channel[Any].open()

    @endpoint
    def ports(self) -> Port[Any]:
        return self.port

    @endpoint
    def send_all_then_receive_all(self, other: Port[Any], count: int, size: int) -> int:
        """Sync: everything out first, then everything in (each side's receiver is
        busy sending, so neither consumes until it is done)."""
        payload = b"y" * size
        for _ in range(count):
            other.send(payload)
        return sum(len(self.inbox.recv().get(timeout=DEADLINE)) for _ in range(count))


class AsyncPeer(Actor):
    def __init__(self) -> None:
        self.port, self.inbox = Channel[Any].open()

    @endpoint
    async def ports(self) -> Port[Any]:
        return self.port

    @endpoint
    async def exchange(self, other: Port[Any], count: int, size: int) -> int:
        """A background task floods ``other`` while this one consumes its own inbox."""
        payload = b"z" * size

        async def flood() -> None:
            for _ in range(count):
                other.send(payload)
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(flood())
        received = 0
        for _ in range(count):
            received += len(await self.inbox.recv())
        await task
        return received


def test_two_actors_flooding_each_other_both_finish(event_loop_kind: str) -> None:
    procs, peers = spawn("peers", AsyncPeer, 2)
    try:
        a, b = peers.slice(procs=0), peers.slice(procs=1)
        port_a, port_b = a.ports.call_one().get(timeout=DEADLINE), b.ports.call_one().get()
        count, size = 20_000, 4096  # 80 MiB each way: past every high-water mark
        done_a = a.exchange.call_one(port_b, count, size)
        done_b = b.exchange.call_one(port_a, count, size)
        assert done_a.get(timeout=DEADLINE) == count * size
        assert done_b.get(timeout=DEADLINE) == count * size
    finally:
        procs.stop().get(timeout=DEADLINE)


def test_two_actors_each_sending_all_before_receiving_both_finish(event_loop_kind: str) -> None:
    """Neither consumes until it has sent everything, more than every buffer and
    high-water mark holds: bounded buffers alone would deadlock. Senders wait for a
    receiver only while it consumes, so both end up buffering and finish."""
    procs, peers = spawn("peers", Peer, 2)
    try:
        a, b = peers.slice(procs=0), peers.slice(procs=1)
        port_a, port_b = a.ports.call_one().get(timeout=DEADLINE), b.ports.call_one().get()
        count, size = 1500, 64 * 1024  # 94 MiB each way
        done_a = a.send_all_then_receive_all.call_one(port_b, count, size)
        done_b = b.send_all_then_receive_all.call_one(port_a, count, size)
        assert done_a.get(timeout=DEADLINE) == count * size
        assert done_b.get(timeout=DEADLINE) == count * size
    finally:
        procs.stop().get(timeout=DEADLINE)


# -- the pipeline soak ---------------------------------------------------------------------


def tensor(size: int) -> Any:
    """A torch tensor of ``size`` floats if torch is importable, else as many bytes."""
    if HAS_TORCH:
        return importlib.import_module("torch").randn(size)
    return os.urandom(4 * size)


def rollout(generator: int, version: int) -> Any:
    return {"generator": generator, "weights": version, "tokens": tensor(256)}


class Generator(Actor):
    def __init__(self) -> None:
        self.version = 0
        self.task: asyncio.Task[None] | None = None
        self.rss = rss()

    @endpoint
    async def start(self, scorer: Port[Any], rank: int) -> None:
        async def generate() -> None:
            while True:
                scorer.send(rollout(rank, self.version))
                await asyncio.sleep(0)

        self.task = asyncio.get_running_loop().create_task(generate())

    @endpoint
    async def update_weights(self, weights: Any, version: int) -> None:
        self.version = version

    @endpoint
    async def stop_generating(self) -> int:
        if self.task is not None:
            self.task.cancel()
        return rss() - self.rss


class Stage(Actor):
    """Scorer or reference: passes what its inbox receives on to the next stage's."""

    def __init__(self) -> None:
        self.port, self.inbox = Channel[Any].open()
        self.task: asyncio.Task[None] | None = None
        self.passed = 0
        self.rss = rss()

    @endpoint
    async def ports(self) -> Port[Any]:
        return self.port

    @endpoint
    async def start(self, downstream: Port[Any]) -> None:
        async def relay() -> None:
            while True:
                item = await self.inbox.recv()
                item["scored"] = True
                downstream.send(item)
                self.passed += 1

        self.task = asyncio.get_running_loop().create_task(relay())

    @endpoint
    async def stats(self) -> tuple[int, int]:
        """Values passed on, and how much this process's RSS grew since it started."""
        return self.passed, rss() - self.rss


class Trainer(Actor):
    def __init__(self, generators: Any) -> None:
        self.generators = generators
        self.port, self.inbox = Channel[Any].open()
        self.version = 0

    @endpoint
    async def ports(self) -> Port[Any]:
        return self.port

    @endpoint
    async def train(self, steps: int, batch: int, scorer: Any) -> tuple[float, int]:
        """``steps`` steps of ``batch`` rollouts each, fresh weights to one generator
        after each (fire and forget). Returns the slowest step's seconds and the most
        the scorer's RSS grew, asked every 100 steps (its endpoint runs beside its
        relay task)."""
        slowest = 0.0
        growth = 0
        for step in range(steps):
            start = time.monotonic()
            for _ in range(batch):
                item = await self.inbox.recv()
                assert item["scored"]
            self.version += 1
            weights = tensor(1024)
            send(self.generators.update_weights, (weights, self.version), {}, selection="choose")
            if step % 100 == 0:
                _, scorer_growth = await scorer.stats.call_one()
                growth = max(growth, scorer_growth)
            slowest = max(slowest, time.monotonic() - start)
        return slowest, growth


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_an_rl_pipeline_under_a_flood_steps_on_in_bounded_memory(event_loop_kind: str) -> None:
    steps, batch = 2000, 4
    generator_procs, generators = spawn("generators", Generator, 4)
    stage_procs = this_host().spawn_procs(per_host={"procs": 3})
    scorer = stage_procs.slice(procs=0).spawn("scorer", Stage)
    reference = stage_procs.slice(procs=1).spawn("reference", Stage)
    trainer = stage_procs.slice(procs=2).spawn("trainer", Trainer, generators)
    try:
        scorer_port = scorer.ports.call_one().get(timeout=DEADLINE)
        reference_port = reference.ports.call_one().get(timeout=DEADLINE)
        trainer_port = trainer.ports.call_one().get(timeout=DEADLINE)
        reference.start.call_one(trainer_port).get(timeout=DEADLINE)
        scorer.start.call_one(reference_port).get(timeout=DEADLINE)
        for rank in range(4):
            generators.slice(procs=rank).start.call_one(scorer_port, rank).get(timeout=DEADLINE)
        slowest, growth = trainer.train.call_one(steps, batch, scorer).get(timeout=300)
        assert slowest < DEADLINE  # every step
        assert growth < RECEIVER_GROWTH
        senders = generators.stop_generating.call().get(timeout=DEADLINE).values()
        assert max(senders) < SENDER_GROWTH
    finally:
        generator_procs.stop().get(timeout=DEADLINE)
        stage_procs.stop().get(timeout=DEADLINE)
