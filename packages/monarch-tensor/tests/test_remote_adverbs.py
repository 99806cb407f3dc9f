"""A remote function's endpoint adverbs: ``call``/``call_one``/``choose``/``stream`` bring
each proc's result back as a value, ``broadcast`` runs it for its effects, in order with the
ops."""

from __future__ import annotations

import programs
import pytest
import torch

from monarch.actor import ProcMesh
from monarch.core.testing import wait_until
from monarch.tensor import RemoteException, inspect, rank_tensor, remote
from monarch.tensor._client import client_for

WAIT = 60.0


def test_call_gathers_every_procs_result(procs: ProcMesh) -> None:
    describe = remote(programs.describe)
    with procs.activate():
        t = torch.ones(4) * (rank_tensor("gpus") + 1)
        got = describe.call(t, extra=0.5).get(timeout=WAIT)
    assert got.item(gpus=0) == {"rank": 0, "sum": 4.5}
    assert got.item(gpus=1) == {"rank": 1, "sum": 8.5}


def test_stream_and_call_one(procs: ProcMesh) -> None:
    where = remote(programs.where)
    with procs.activate():
        results = [f.get(timeout=WAIT) for f in where.stream()]
        with pytest.raises(ValueError, match="one proc"):
            where.call_one()
    assert [r[0] for r in results] == [0, 1]
    assert torch.equal(results[1][1], torch.arange(3.0) * 2)  # a tensor in a result, detached
    with procs.slice(gpus=1).activate():
        rank, _ = where.call_one().get(timeout=WAIT)
    assert rank == 0  # its rank in the one-proc slice


def test_choose_runs_on_one_proc(procs: ProcMesh) -> None:
    where = remote(programs.where)
    with procs.activate():
        ranks = {where.choose().get(timeout=WAIT)[0] for _ in range(20)}
    assert ranks <= {0, 1} and len(ranks) == 2  # one proc each time, either of them


def test_broadcast_runs_in_order_with_the_ops(procs: ProcMesh) -> None:
    bump = remote(programs.bump_)
    with procs.activate():
        t = torch.zeros(2)
        bump.broadcast(t)
        u = t * 10
    assert torch.equal(inspect(u, gpus=1), torch.full((2,), 10.0))


def test_a_failure_raises_at_the_result(procs: ProcMesh) -> None:
    fail = remote(programs.fail_on_rank)
    with procs.activate():
        t = torch.ones(2)
        with pytest.raises(RemoteException, match="refused on rank 1"):
            fail.call(t, 1).get(timeout=WAIT)
        fine = fail.call(t, 5).get(timeout=WAIT)  # and the next call works
    assert torch.equal(fine.item(gpus=1), torch.ones(2))


def test_results_are_not_kept(procs: ProcMesh) -> None:
    describe = remote(programs.describe)
    workers = client_for(procs).workers()
    with procs.activate():
        t = torch.ones(1)
    inspect(t)
    before = set(workers.live_ids.call().get(timeout=WAIT).item(gpus=0))
    with procs.activate():
        describe.call(t).get(timeout=WAIT)
        list(describe.stream(t))
        describe.broadcast(t)

    def kept() -> set[int]:
        return set(workers.live_ids.call().get(timeout=WAIT).item(gpus=0)) - before

    # No result is kept: nothing new stays live. (Frees ride with the next batch, or go
    # alone a moment later: one of an earlier temporary may land between the snapshots.)
    wait_until(lambda: not kept(), WAIT, "the deletion of the adverbs' results")


def test_adverbs_need_an_active_mesh() -> None:
    with pytest.raises(ValueError, match="active mesh"):
        remote(programs.describe).call(torch.ones(1))


def test_call_on_shard_and_fetch_brings_any_value(procs: ProcMesh) -> None:
    from monarch.tensor import call_on_shard_and_fetch

    describe = remote(programs.describe)
    with procs.activate():
        t = torch.ones(3) * (rank_tensor("gpus") + 1)
    got = call_on_shard_and_fetch(describe, t, shard={"gpus": 1}).get(timeout=WAIT)
    assert got == {"rank": 1, "sum": 6.0}
