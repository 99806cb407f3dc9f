"""``coalescing()``: a block's commands reach each worker as one message, at its end."""

from __future__ import annotations

import torch

import monarch
from monarch.actor import ProcMesh
from monarch.tensor import coalescing, fetch_shard, inspect, to_mesh
from monarch.tensor._client import BATCH, client_for

WAIT = 60.0


def batches(procs: ProcMesh) -> list[int]:
    """Messages of commands each worker has run (a gathered call: after every one sent)."""
    return list(client_for(procs).workers().batches.call().get(timeout=WAIT).values())


def test_a_block_is_one_message_whatever_its_length(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.zeros(2)
    inspect(t)
    before = batches(procs)
    with coalescing():
        with procs.activate():
            for _ in range(3 * BATCH):  # three batches' worth
                t = t + 1
        assert batches(procs) == before  # nothing sent yet, not even at activate()'s end
    assert batches(procs) == [b + 1 for b in before]
    assert torch.equal(inspect(t, gpus=1), torch.full((2,), 3.0 * BATCH))
    with procs.activate():  # and without it, a batch at a time
        for _ in range(3 * BATCH):
            t = t + 1
    inspect(t)
    assert all(b >= a + 4 for a, b in zip(before, batches(procs), strict=True))


def test_nested_blocks_send_at_the_outermost_end(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(2)
    inspect(t)
    before = batches(procs)
    with monarch.coalescing():  # the top-level name
        with coalescing(), procs.activate():
            u = t * 3
        assert batches(procs) == before
    assert torch.equal(inspect(u, gpus=0), torch.full((2,), 3.0))


def test_a_fetch_inside_sends_what_it_needs(procs: ProcMesh, grid: ProcMesh) -> None:
    """Nothing waits forever on commands held back: a fetch sends its mesh's, a move to
    another mesh sends the source's."""
    with coalescing():
        with procs.activate():
            t = torch.arange(3.0) + 1
        assert torch.equal(fetch_shard(t, gpus=1).get(timeout=WAIT), torch.arange(3.0) + 1)
        with procs.activate():
            u = t * 2
        moved = to_mesh(u, grid)
        assert torch.equal(inspect(moved, hosts=1, gpus=0), (torch.arange(3.0) + 1) * 2)
