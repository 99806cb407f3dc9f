"""A monarch Tensor passed to an actor endpoint arrives as the receiving proc's shard, after
every command recorded before the call; a failed one fails the call with its error."""

from __future__ import annotations

import pickle

import programs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import ActorMesh, ProcMesh, as_endpoint, this_host
from monarch.tensor import Tensor, inspect, rank_tensor, remote

WAIT = 60.0


@pytest.fixture(scope="module")
def users(procs: ProcMesh) -> ActorMesh[programs.ShardUser]:
    return procs.spawn("shard_users", programs.ShardUser)


def test_each_actor_gets_its_procs_shard(
    procs: ProcMesh, users: ActorMesh[programs.ShardUser]
) -> None:
    with procs.activate():
        t = torch.arange(4.0) * (rank_tensor("gpus") + 1)  # sums: 6 on rank 0, 12 on rank 1
    got = users.total.call(t, scale=2.0).get(timeout=WAIT)
    assert got.item(gpus=0) == 12.0 and got.item(gpus=1) == 24.0
    pair = users.pair.call({"a": t, "b": t * 10}).get(timeout=WAIT)
    assert pair.item(gpus=1) == [12.0, 120.0]


def test_the_call_sees_every_command_before_it(
    procs: ProcMesh, users: ActorMesh[programs.ShardUser]
) -> None:
    """The worker may still be running earlier commands when the call arrives: the actor
    waits for the shard as it is after them."""
    with procs.activate():
        t = torch.zeros(200, 200)
        for _ in range(300):
            t = t + 1
    one = users.slice(gpus=1)
    assert one.total.call_one(t).get(timeout=WAIT) == 300.0 * 200 * 200


def test_the_actor_holds_the_shard_itself(
    procs: ProcMesh, users: ActorMesh[programs.ShardUser]
) -> None:
    with procs.activate():
        t = torch.zeros(3)
    users.bump.call(t).get(timeout=WAIT)
    with procs.activate():
        after = t * 2  # recorded after the call: sees the change
    assert torch.equal(inspect(after, gpus=1), torch.full((3,), 2.0))


def test_an_async_actor_gets_it_too(procs: ProcMesh) -> None:
    actors = procs.spawn("async_shard_users", programs.AsyncShardUser)
    with procs.activate():
        t = torch.ones(5) * (rank_tensor("gpus") + 1)
    got = actors.total.call(t).get(timeout=WAIT)
    assert list(got.values()) == [5.0, 10.0]


def test_a_failed_tensor_fails_the_call_with_its_error(
    procs: ProcMesh, users: ActorMesh[programs.ShardUser]
) -> None:
    fail = remote(programs.fail_on_rank)
    with procs.activate():
        bad = fail(torch.ones(2), 1)
    with pytest.raises(Exception, match="refused on rank 1"):
        users.total.call(bad).get(timeout=WAIT)
    with procs.activate():
        good = torch.ones(2)
    assert users.slice(gpus=1).total.call_one(good).get(timeout=WAIT) == 2.0


def test_an_actor_on_other_procs_is_refused_at_the_call(procs: ProcMesh) -> None:
    """Its proc would wait for a shard that never comes: the call is refused at once."""
    others = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        strangers = others.spawn("strangers", programs.ShardUser)
        strangers.initialized.get(timeout=WAIT)
        with procs.activate():
            t = torch.ones(3)
        with pytest.raises(TypeError, match="not on the tensor's mesh"):
            strangers.total.call(t)
        # a slice of an actor mesh on the tensor's own procs is fine
        users = procs.spawn("slice_users", programs.ShardUser)
        assert users.slice(gpus=0).total.call_one(t).get(timeout=WAIT) == 3.0
    finally:
        others.stop().get(timeout=WAIT)


def test_anywhere_else_pickling_is_refused(procs: ProcMesh) -> None:
    with procs.activate():
        t = torch.ones(2)
    with pytest.raises(TypeError, match="only passed to an actor endpoint"):
        pickle.dumps(t)


def test_rref_makes_an_endpoints_results_a_tensor(procs: ProcMesh) -> None:
    doublers = procs.spawn("doublers", programs.Doubler)
    with procs.activate():
        t = torch.ones(3)
        t.add_(1)  # recorded before: the endpoint sees it
        r = doublers.double.rref(t)
        after = r + 100  # recorded after: sees the endpoint's result
    assert isinstance(r, Tensor) and r.shape == (3,)
    pids = procs.spawn("pids", programs.ShardUser)  # each proc's own pid, to tell them apart
    for gpu in (0, 1):
        pid = pids.slice(gpus=gpu).pid.call_one().get(timeout=WAIT)
        made = 4.0 + pid % 2
        assert torch.equal(inspect(r, gpus=gpu), torch.full((3,), made))
        assert torch.equal(inspect(after, gpus=gpu), torch.full((3,), made + 100))
    assert doublers.sums.call().get(timeout=WAIT).item(gpus=1) == [6.0]


def test_rref_needs_a_propagate_and_an_active_mesh(procs: ProcMesh) -> None:
    doublers = procs.spawn("doublers_again", programs.Doubler)
    with procs.activate():
        t = torch.ones(3)
        with pytest.raises(ValueError, match="propagate"):
            doublers.plain.rref(t)
    with pytest.raises(ValueError, match="active mesh"):
        doublers.double.rref(t)


def test_a_constructor_takes_its_procs_shard(procs: ProcMesh) -> None:
    """Spawned inside ``activate()`` with a monarch Tensor, each actor gets its proc's
    shard as the commands before the spawn left it; its endpoint's tensors come back as
    each proc's values (local tensors, as upstream's: ``.item(gpus=0)``)."""
    with procs.activate():
        w = torch.ones(2) * (rank_tensor("gpus") + 1)
        w.add_(10)  # recorded before the spawn: the constructor sees it
        actors = procs.spawn("weighted", programs.Weighted, w)
        y = torch.arange(2.0) * (rank_tensor("gpus") + 1)
        got = actors.forward.call(y).get(timeout=WAIT)
    for gpu in (0, 1):
        local_w = torch.ones(2) * (gpu + 1) + 10
        local_y = torch.arange(2.0) * (gpu + 1)
        assert torch.equal(got.item(gpus=gpu), local_y * 2 + local_w)
    assert torch.equal(inspect(w, gpus=1), torch.full((2,), 12.0))  # the spawn changed nothing


def test_as_endpoint_rref_runs_a_plain_method_in_order(procs: ProcMesh) -> None:
    """``as_endpoint(actors.method, propagate=...).rref(t)``: each proc's actor runs the
    method on its shard, after the ops before it, and the ops after it see its result."""
    with procs.activate():
        w = torch.full((3,), 5.0)
        actors = procs.spawn("weighted_rref", programs.Weighted, w)
        t = torch.ones(3) * (rank_tensor("gpus") + 1)
        t.mul_(2)  # recorded before the call
        r = as_endpoint(actors.scaled, propagate=lambda y: y.clone()).rref(t)
        after = r + 1
    assert isinstance(r, Tensor) and r.shape == (3,)
    for gpu in (0, 1):
        local_t = torch.ones(3) * (gpu + 1) * 2
        assert torch.equal(inspect(r, gpus=gpu), local_t * 3 + 5)
        assert torch.equal(inspect(after, gpus=gpu), local_t * 3 + 6)
        assert torch.equal(inspect(t, gpus=gpu), local_t)  # its input is not changed


@pytest.fixture(scope="module")
def weighted(procs: ProcMesh) -> ActorMesh[programs.Weighted]:
    with procs.activate():
        w = torch.arange(4.0) * (rank_tensor("gpus") + 1)
        return procs.spawn("weighted_props", programs.Weighted, w)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(st.integers(-50, 50), min_size=4, max_size=4),
    scale=st.integers(-3, 3),
)
def test_actor_tensor_calls_compute_as_locally(
    procs: ProcMesh, weighted: ActorMesh[programs.Weighted], values: list[int], scale: int
) -> None:
    """An endpoint call, ``rref`` and ``as_endpoint(...).rref`` give each proc what the
    same code gives run locally on its shard, and change no tensor the program did not
    write."""
    with procs.activate():
        y = torch.tensor(values, dtype=torch.float32) * (rank_tensor("gpus") + scale)
        r = as_endpoint(weighted.scaled, propagate=lambda y: y.clone()).rref(y)
        got = weighted.forward.call(y).get(timeout=WAIT)
    for gpu in (0, 1):
        local_w = torch.arange(4.0) * (gpu + 1)
        local_y = torch.tensor(values, dtype=torch.float32) * (gpu + scale)
        assert torch.equal(got.item(gpus=gpu), local_y * 2 + local_w)
        assert torch.equal(inspect(r, gpus=gpu), local_y * 3 + local_w)
        assert torch.equal(inspect(y, gpus=gpu), local_y)
