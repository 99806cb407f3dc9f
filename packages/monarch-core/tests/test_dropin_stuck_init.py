"""Drop-in actors whose ``__init__`` never returns, as upstream's: what the constructor did
before it blocked (spawning, sending on a port) takes effect, and the mesh can still be
stopped (the stop returns at ``cleanup_timeout``), then its procs.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from monarch.actor import Actor, Channel, Port, ProcMesh, endpoint, this_host


class Counter(Actor):
    def __init__(self, value: int) -> None:
        self.value_ = value

    @endpoint
    async def value(self) -> int:
        return self.value_


class AsyncForever(Actor):
    """Blocks in ``__init__`` after spawning a counter and sending it on a port."""

    def __init__(self, procs: ProcMesh, send: Port[Any]) -> None:
        send.send(procs.spawn("counter_from_init", Counter, 42))
        threading.Event().wait()

    @endpoint
    async def unreachable(self) -> None:
        pass


class SyncForever(Actor):
    def __init__(self, procs: ProcMesh, send: Port[Any]) -> None:
        send.send(procs.spawn("counter_from_init", Counter, 42))
        threading.Event().wait()

    @endpoint
    def unreachable(self) -> None:
        pass


@pytest.mark.parametrize("cls", [AsyncForever, SyncForever], ids=["async", "sync"])
def test_an_init_that_never_returns_lets_its_effects_through_and_stops(cls: type) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    send, receive = Channel[Any].open()
    forever: Any = procs.spawn("forever", cls, procs, send)
    counter = receive.recv().get(timeout=60)
    assert counter.value.call_one().get(timeout=60) == 42
    forever.stop().get(timeout=60)
    procs.stop().get(timeout=60)


def test_an_init_that_never_returns_stops_when_awaited() -> None:
    async def main() -> None:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        send, receive = Channel[Any].open()
        forever: Any = procs.spawn("forever", AsyncForever, procs, send)
        counter = await receive.recv()
        assert await counter.value.call_one() == 42
        await forever.stop()
        await procs.stop()

    asyncio.run(main())  # as upstream's users write it: their own event loop
