"""A controller written with async code awaits the engine's futures, on both anyio backends."""

from __future__ import annotations

import programs
import pytest
import torch

from monarch.actor import ProcMesh
from monarch.tensor import fetch_shard, rank_tensor, remote

pytestmark = pytest.mark.anyio


async def test_await_fetches_calls_and_moves(procs: ProcMesh, grid: ProcMesh) -> None:
    describe = remote(programs.describe)
    with procs.activate():
        t = torch.ones(2) * (rank_tensor("gpus") + 1)
        gathered = describe.call(t)
    assert torch.equal(await fetch_shard(t, gpus=1), torch.full((2,), 2.0))
    assert (await gathered).item(gpus=0) == {"rank": 0, "sum": 2.0}
    moved = t.to_mesh(grid)
    assert torch.equal(await fetch_shard(moved, hosts=1, gpus=1), torch.full((2,), 2.0))


async def test_await_an_actor_given_a_tensor(procs: ProcMesh) -> None:
    users = procs.spawn("async_controller_users", programs.ShardUser)
    with procs.activate():
        t = torch.arange(3.0) * (rank_tensor("gpus") + 1)
    got = await users.total.call(t)
    assert got.values() == [3.0, 6.0]
