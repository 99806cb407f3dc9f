"""An in-place write that plain torch refuses raises at the call on the controller too
(``_inplace``), and leaves every tensor as it was; one torch allows gives torch's values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import ProcMesh
from monarch.tensor import fetch_shard

WAIT = 60.0

DTYPES = [
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.float16,
    torch.float32,
    torch.float64,
]
OPS = ["sub", "add_", "sub_", "mul_", "div_", "__iadd__", "__imul__", "add out", "mul out", "copy_"]
SCALARS = [2, 3, -1, 1.5, -0.5, True]


def make(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Non-zero values (no division by zero), the same on every proc and here."""
    n = 1
    for size in shape:
        n *= size
    return (torch.arange(n) % 3 + 1).reshape(shape).to(dtype)


def apply(op: str, target: torch.Tensor, other: Any) -> None:
    if op.endswith(" out"):
        getattr(torch, op.split()[0])(target, other, out=target)
    elif op == "copy_":
        target.copy_(other if isinstance(other, torch.Tensor) else torch.tensor(other))
    else:
        getattr(target, op)(other)


Case = Callable[[], tuple[torch.Tensor, torch.Tensor, Any]]


def case(dtype: torch.dtype, other: Any, other_shape: tuple[int, ...], expanded: bool) -> Case:
    """A fresh (base, written, other): ``written`` is ``base`` or an expanded view of it."""

    def build() -> tuple[torch.Tensor, torch.Tensor, Any]:
        base = make(dtype, (3,) if expanded else (2, 3))
        written = base.expand(2, 3) if expanded else base
        value = make(other[0], other_shape) if isinstance(other, tuple) else other
        return base, written, value

    return build


other_value = st.one_of(
    st.sampled_from(SCALARS),
    st.tuples(st.sampled_from(DTYPES)),  # a tensor of that dtype
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=st.sampled_from(DTYPES),
    op=st.sampled_from(OPS),
    other=other_value,
    other_shape=st.sampled_from([(), (3,), (2, 3), (4,)]),
    expanded=st.booleans(),
)
def test_in_place_ops_raise_exactly_where_torch_does(
    procs: ProcMesh,
    dtype: torch.dtype,
    op: str,
    other: Any,
    other_shape: tuple[int, ...],
    expanded: bool,
) -> None:
    """Dtype promotion the written tensor cannot hold, broadcasting it cannot take, an
    expanded (self-overlapping) output: the same exception type as local torch, at the call,
    with nothing written; otherwise the same values. The examples share one controller, so
    the metadata caches meet the same shapes with other dtypes and scalar types."""
    build = case(dtype, other, other_shape, expanded)
    initial = build()[0]
    base, written, value = build()
    local_error: type[BaseException] | None = None
    try:
        apply(op, written, value)
    except Exception as exc:  # noqa: BLE001 - the type is the property's subject
        local_error = type(exc)
    with procs.activate():
        r_base, r_written, r_value = build()
        ours: type[BaseException] | None = None
        try:
            apply(op, r_written, r_value)
        except Exception as exc:  # noqa: BLE001
            ours = type(exc)
    assert ours is local_error
    fetched = [r_base, r_value] if isinstance(value, torch.Tensor) else [r_base]
    got = fetch_shard(fetched, gpus=0).get(timeout=WAIT)
    # torch's values where it writes; the initial ones where it refuses
    torch.testing.assert_close(got[0], initial if local_error else base, equal_nan=True)
    if isinstance(value, torch.Tensor):
        torch.testing.assert_close(got[1], value)  # the operand is never written


@pytest.mark.parametrize("scalar_first", [True, False])
def test_a_cached_op_still_checks_a_new_scalar_type(procs: ProcMesh, scalar_first: bool) -> None:
    """The same op on the same shapes, once with an int scalar and once with a float one:
    whichever comes first, the float one on an int64 tensor raises torch's error and the
    int one works (neither cache answers for the other)."""
    with procs.activate():
        t = torch.zeros(4, dtype=torch.int64)
        u = torch.zeros(4, dtype=torch.int64)
        if scalar_first:
            t.mul_(2)
            u.add_(1)
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
            t.mul_(1.5)
        with pytest.raises(RuntimeError, match="in-place ops are not possible"):
            u.add_(1.5)
        t.mul_(2)
        u.add_(1)
        promoted = torch.mul(t, 1.5)  # out of place: a new float tensor, never an error
        kept = torch.mul(t, 2)  # the same op and shapes as a cached entry, an int scalar
        promoted_again = torch.mul(t, 1.5)
    assert (promoted.dtype, kept.dtype, promoted_again.dtype) == (
        torch.float32,
        torch.int64,
        torch.float32,
    )
    got = fetch_shard((t, u, promoted), gpus=0).get(timeout=WAIT)
    assert [x.tolist() for x in got] == [[0] * 4, [2 if scalar_first else 1] * 4, [0.0] * 4]
