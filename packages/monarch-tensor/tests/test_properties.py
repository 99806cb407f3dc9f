"""Property: a random program of elementwise ops and reductions, run sharded on the mesh,
gives on each proc what the same program gives locally on that proc's data."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import ProcMesh
from monarch.tensor import Tensor, fetch_shard, rank_tensor

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
)
def test_sharded_programs_match_local_runs(
    procs: ProcMesh, shape: list[int], ops: list[tuple[Any, ...]], mesh_reduce: bool
) -> None:
    numel = 1
    for size in shape:
        numel *= size

    def data(offset: Any) -> Any:
        return torch.arange(float(numel)).reshape(shape) * 0.25 + offset

    with procs.activate():
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
