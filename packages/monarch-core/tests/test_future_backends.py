"""Futures awaited from async code on both anyio backends (asyncio and trio)."""

from __future__ import annotations

import pytest

from monarch.actor import Actor, endpoint, returns_future, this_proc

pytestmark = pytest.mark.anyio


class Doubler(Actor):
    @endpoint
    def double(self, x: int) -> int:
        return 2 * x


async def test_await_an_adverb_future() -> None:
    doubler = this_proc().spawn("doubler", Doubler)
    assert await doubler.double.call_one(21) == 42
    mesh = await doubler.double.call(4)
    assert mesh.values() == [8]


async def test_await_a_failed_future_raises() -> None:
    @returns_future
    async def boom() -> None:
        raise KeyError("lazy")

    with pytest.raises(KeyError, match="lazy"):
        await boom()
