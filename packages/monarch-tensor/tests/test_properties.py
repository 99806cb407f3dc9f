"""Property: a random program of elementwise ops and reductions, run sharded on the mesh,
gives on each proc what the same program gives locally on that proc's data."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import programs
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
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


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    shape=st.lists(st.integers(1, 4), min_size=2, max_size=3),
    ops=st.lists(op, min_size=1, max_size=6),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
    transposed=st.booleans(),
)
def test_controller_metadata_matches_local_runs(
    procs: ProcMesh,
    shape: list[int],
    ops: list[tuple[Any, ...]],
    dtype: torch.dtype,
    transposed: bool,
) -> None:
    """Each value's shape, strides and dtype on the controller (torch's meta kernels, run
    without importing ``torch._dynamo``: ``_metakernels``) are those of the same program run
    locally, type promotion and non-contiguous inputs included; the shards' values too."""

    def data(offset: Any) -> Any:
        x = (torch.arange(numel) + offset).reshape(shape).to(dtype)
        return x.transpose(0, -1) if transposed else x

    numel = 1
    for size in shape:
        numel *= size
    try:
        local = run(data(0), ops)
    except RuntimeError:  # not a program for this dtype (the mean of integers, say)
        assume(False)
    with procs.activate():
        values = run(data(rank_tensor("gpus")), ops)
    for value, expected in zip(values, local, strict=True):
        assert (value.shape, value.dtype) == (expected.shape, expected.dtype)
        # the strides that address anything (a dimension of size 1 may have any)
        assert [s for s, n in zip(value.stride(), value.shape, strict=True) if n > 1] == [
            s for s, n in zip(expected.stride(), expected.shape, strict=True) if n > 1
        ]
    got = fetch_shard(values, gpus=0).get(timeout=WAIT)
    for a, b in zip(got, local, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


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


# Remote functions as upstream's docs declare them: with a propagate that says the result's
# shape (often by returning the argument itself), with none (ours: the function on meta
# tensors), and "cached" (the first proc's run says it; not for a function that writes, which
# would run twice there).
def variants(fn: Any, declared: Any, cached: bool = True) -> dict[str, Any]:
    """``fn`` as a remote function with its shape ``declared``, with none, and cached."""
    made = {"declared": remote(fn, propagate=declared), "none": remote(fn)}
    if cached:
        made["cached"] = remote(fn, propagate="cached")
    return made


REMOTES: dict[str, dict[str, Any]] = {
    "plus_one": variants(programs.plus_one, lambda t: t),
    "plus_sum_of": variants(programs.plus_sum_of, lambda t, other: t),
    "first_row": variants(programs.first_row, lambda t: t[0]),
    "transposed": variants(programs.transposed, lambda t: t.t()),
    "same": variants(programs.same, lambda t: t),
    "bumped": variants(programs.bumped, lambda t, by: t, cached=False),
}
TORCH_STEPS = ["add_", "row", "t", "mul"]

step = st.one_of(
    st.tuples(
        st.sampled_from(sorted(REMOTES)),
        st.sampled_from(["declared", "none", "cached"]),
        st.integers(0, 30),
        st.integers(0, 30),
    ),
    st.tuples(
        st.just("torch"), st.sampled_from(TORCH_STEPS), st.integers(0, 30), st.integers(0, 30)
    ),
)


def run_steps(x: Any, steps: list[tuple[str, str, int, int]], remote_fns: bool) -> list[Any]:
    """The program: the same on local tensors (the plain functions) and on monarch Tensors
    (the remote ones). Each step reads earlier values; writes go through views to their
    bases, as torch's do."""
    values = [x, x * 1]  # the second is read, never written unless a step writes it
    for name, how, a, b in steps:
        src, other = values[a % len(values)], values[b % len(values)]
        by = float(b % 3 + 1)
        if name == "first_row" and src.dim() == 0:
            name = "plus_one"  # no row of a scalar
        if name == "torch":
            if how == "add_":
                src.add_(by)
                continue
            if how == "row":
                values.append(src[0] if src.dim() else src + 0)
            elif how == "t":
                values.append(src.t())
            else:
                values.append(src.mul(by))
            continue
        variants = REMOTES[name]
        fn = variants.get(how, variants["declared"]) if remote_fns else getattr(programs, name)
        if name == "plus_sum_of":
            values.append(fn(src, other))
        elif name == "bumped":
            values.append(fn(src, by))
        else:
            values.append(fn(src))
    return values


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 3),
    cols=st.integers(1, 3),
    steps=st.lists(step, min_size=1, max_size=8),
)
def test_remote_function_programs_match_local_runs(
    procs: ProcMesh, rows: int, cols: int, steps: list[tuple[str, str, int, int]]
) -> None:
    """Programs of remote functions (with a declared propagate, with none, cached), views and
    in-place ops give every value as the same program run locally, on each proc's data: a
    result is never an input in disguise, and nothing the program did not write changes."""

    def data(offset: Any) -> Any:
        return torch.arange(float(rows * cols)).reshape(rows, cols) * 0.25 + offset

    with procs.activate():
        values = run_steps(data(rank_tensor("gpus")), steps, remote_fns=True)
    for rank in (0, 1):
        local = run_steps(data(rank), steps, remote_fns=False)
        got = fetch_shard(values, gpus=rank).get(timeout=WAIT)
        assert len(got) == len(local)
        for a, b in zip(got, local, strict=True):
            torch.testing.assert_close(a, b)


def test_a_propagate_returning_its_argument_leaves_the_argument_alone(procs: ProcMesh) -> None:
    """Upstream's docs' ``@remote(propagate=lambda x: x) def addone(x): return x + 1``: each
    call gives 2, and the input stays 1."""
    addone = REMOTES["plus_one"]["declared"]
    with procs.activate():
        t = torch.ones(4, 4)
        first, second = addone(t), addone(t)
    assert fetch_shard(first).get(timeout=WAIT).eq(2).all()
    assert fetch_shard(second).get(timeout=WAIT).eq(2).all()
    assert fetch_shard(t).get(timeout=WAIT).eq(1).all()
