"""Property: a random program of elementwise ops and reductions, run sharded on the mesh,
gives on each proc what the same program gives locally on that proc's data."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import programs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import ProcMesh
from monarch.tensor import RemoteException, Tensor, coalescing, fetch_shard, rank_tensor, remote

WAIT = 60.0

UNARY = ["neg", "abs", "sin", "tanh", "relu"]
SCALAR = ["add", "mul", "sub"]
BINARY = ["add", "mul", "maximum", "sub"]
REDUCE = ["sum", "mean", "amax"]
INPLACE = ["add_", "mul_"]

op = st.one_of(
    st.tuples(st.just("unary"), st.sampled_from(UNARY)),
    st.tuples(st.just("scalar"), st.sampled_from(SCALAR), st.floats(-2, 2, width=32)),
    st.tuples(st.just("binary"), st.sampled_from(BINARY), st.integers(0, 20)),
    st.tuples(st.just("reduce"), st.sampled_from(REDUCE), st.integers(0, 2)),
    st.tuples(st.just("inplace"), st.sampled_from(INPLACE), st.floats(-2, 2, width=32)),
)


def run(x: torch.Tensor, ops: list[tuple[Any, ...]]) -> list[torch.Tensor]:
    """The program: works the same on local tensors and on monarch Tensors."""
    values = [x]
    for kind, name, *rest in ops:
        if kind == "unary":
            x = getattr(torch, name)(x)
        elif kind == "scalar":
            x = getattr(torch, name)(x, rest[0])
        elif kind == "binary":
            x = getattr(torch, name)(x, values[rest[0] % len(values)])
        elif kind == "reduce":
            x = x - getattr(x, name)(dim=rest[0] % x.dim(), keepdim=True)
        else:
            getattr(x, name)(rest[0])
        values.append(x)
    return values


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    ops=st.lists(op, min_size=1, max_size=8),
    mesh_reduce=st.booleans(),
    coalesce=st.booleans(),
)
def test_sharded_programs_match_local_runs(
    procs: ProcMesh,
    shape: list[int],
    ops: list[tuple[Any, ...]],
    mesh_reduce: bool,
    coalesce: bool,
) -> None:
    """(Inside ``coalescing()`` or not: one message or several, the same results.)"""
    numel = 1
    for size in shape:
        numel *= size

    def data(offset: Any) -> Any:
        return torch.arange(float(numel)).reshape(shape) * 0.25 + offset

    with coalescing() if coalesce else nullcontext(), procs.activate():
        values = run(data(rank_tensor("gpus")), ops)
        last = values[-1]
        assert isinstance(last, Tensor)
        total = last.reduce("gpus") if mesh_reduce else last
    local = [run(data(rank), ops) for rank in (0, 1)]
    for rank in (0, 1):
        got = fetch_shard(values, gpus=rank).get(timeout=WAIT)
        assert len(got) == len(local[rank])
        for a, b in zip(got, local[rank], strict=True):
            torch.testing.assert_close(a, b, equal_nan=True)
    expected = local[0][-1] + local[1][-1] if mesh_reduce else local[1][-1]
    got_total = fetch_shard(total, gpus=1).get(timeout=WAIT)
    torch.testing.assert_close(got_total, expected, equal_nan=True)


node = st.one_of(
    st.tuples(st.just("fail"), st.integers(0, 30), st.sampled_from([-1, 0, 1])),
    st.tuples(st.just("add"), st.integers(0, 30), st.integers(0, 30)),
    st.tuples(st.just("reduce"), st.integers(0, 30), st.just(0)),
)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(nodes=st.lists(node, min_size=1, max_size=6))
def test_a_failure_poisons_exactly_its_dependents(
    procs: ProcMesh, nodes: list[tuple[str, int, int]]
) -> None:
    """Random graphs of ops, some failing on one rank: a fetch fails exactly when the value
    depends on a failure on that rank (or, through a reduction, on any rank)."""
    fail = remote(programs.fail_on_rank)
    with procs.activate():
        values: list[Any] = [torch.ones(3) + rank_tensor("gpus")]
        for kind, a, b in nodes:
            x = values[a % len(values)]
            if kind == "fail":
                values.append(fail(x, b))
            elif kind == "add":
                values.append(x + values[b % len(values)])
            else:
                values.append(x.reduce("gpus"))
    # the local model: each node's value and whether it is poisoned, per rank
    local: list[list[torch.Tensor]] = [[torch.ones(3) + r] for r in (0, 1)]
    bad: list[list[bool]] = [[False], [False]]
    for kind, a, b in nodes:
        i, j = a % len(bad[0]), b % len(bad[0])
        for r in (0, 1):
            if kind == "fail":
                bad[r].append(bad[r][i] or b == r)
                local[r].append(local[r][i])
            elif kind == "add":
                bad[r].append(bad[r][i] or bad[r][j])
                local[r].append(local[r][i] + local[r][j])
            else:
                bad[r].append(bad[0][i] or bad[1][i])
                local[r].append(local[0][i] + local[1][i])
    for r in (0, 1):
        for n, value in enumerate(values):
            future = fetch_shard(value, gpus=r)
            if bad[r][n]:
                with pytest.raises(RemoteException):
                    future.get(timeout=WAIT)
            else:
                torch.testing.assert_close(future.get(timeout=WAIT), local[r][n])
