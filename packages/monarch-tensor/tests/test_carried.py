"""A fetch carries the short batch still buffered to its worker (one message instead of
two); the other workers get it in a broadcast that the fetched worker passes over. Each
worker runs every batch once, in its own point's context (``current_rank()``)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import ProcMesh, current_rank
from monarch.tensor import fetch_shard, rank_tensor, remote
from monarch.tensor._client import CARRIED, client_for

WAIT = 60.0


def rank_plus(t: torch.Tensor) -> torch.Tensor:
    """``t`` plus this proc's rank as the running command sees it."""
    return t + float(current_rank().rank)


plus_rank = remote(rank_plus, propagate=lambda t: t.clone())


def batches(procs: ProcMesh) -> list[int]:
    return list(client_for(procs).workers().batches.call().get(timeout=WAIT).values())


def test_a_carried_batch_runs_once_per_worker_with_its_own_rank(grid: ProcMesh) -> None:
    """On a 2x2 mesh, each rank in turn is fetched right after a short batch: the batch
    (a remote function reading ``current_rank()``, ``rank_tensor``) gives every rank its
    own values, and every worker counts each batch once."""
    with grid.activate():
        t = torch.zeros(3)
    fetch_shard(t).get(timeout=WAIT)  # a first batch, broadcast: later ones may be carried
    before = batches(grid)
    for rank in range(4):
        hosts, gpus = divmod(rank, 2)
        with grid.activate():  # the fetch inside: the batch is still buffered at it
            u = plus_rank(t) * 10 + rank_tensor("gpus")
            got = fetch_shard(u, hosts=hosts, gpus=gpus).get(timeout=WAIT)
        assert torch.equal(got, torch.full((3,), 10.0 * rank + gpus))
    after = batches(grid)
    assert [b - a for a, b in zip(before, after, strict=True)] == [4] * 4


def test_a_long_batch_is_broadcast_and_its_values_are_the_same(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.zeros(2)
    fetch_shard(t).get(timeout=WAIT)
    with procs.activate():
        for _ in range(CARRIED + 5):
            t = t + rank_tensor("gpus") + 1
        got = fetch_shard(t, gpus=1).get(timeout=WAIT)
    assert torch.equal(got, torch.full((2,), 2.0 * 37))
    assert torch.equal(fetch_shard(t, gpus=0).get(timeout=WAIT), torch.full((2,), 37.0))


step = st.one_of(
    st.tuples(st.just("op"), st.floats(-2, 2, width=32), st.just(0)),
    st.tuples(st.just("remote"), st.just(0.0), st.just(0)),
    st.tuples(st.just("fetch"), st.just(0.0), st.integers(0, 1)),
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(step, min_size=1, max_size=10))
def test_programs_with_fetches_between_ops_match_local_runs(
    procs: ProcMesh, steps: list[tuple[str, float, int]]
) -> None:
    """Ops, remote functions and fetches of either rank in any order: every fetched value is
    the local program's on that rank's data (a batch run twice, or not at all, or with
    another rank, would show), and each worker ran as many batches as the other."""
    before = batches(procs)
    got = []
    with procs.activate():
        x = torch.arange(4.0)
        rank = rank_tensor("gpus")
        for kind, by, where in steps:
            if kind == "op":
                x = x * by + rank
            elif kind == "remote":
                x = plus_rank(x)
            else:
                got.append(fetch_shard(x, gpus=where).get(timeout=WAIT))
    got.append(fetch_shard(x, gpus=1).get(timeout=WAIT))
    expected = []
    local = {r: torch.arange(4.0) for r in (0, 1)}
    for kind, by, where in steps:
        if kind == "fetch":
            expected.append(local[where])
            continue
        for r in (0, 1):
            local[r] = local[r] * by + r if kind == "op" else local[r] + r
    expected.append(local[1])
    assert len(got) == len(expected)
    for value, want in zip(got, expected, strict=True):
        torch.testing.assert_close(value, want)
    after = batches(procs)
    assert after[1] - before[1] == after[0] - before[0]
