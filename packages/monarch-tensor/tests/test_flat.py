"""The shortcut around torch's pytree gives torch's leaves, in torch's order, and rebuilds
what it flattened."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._pytree import tree_flatten

from monarch.tensor._flat import flatten, flatten_call, unflatten

leaves = st.one_of(
    st.integers(),
    st.floats(allow_nan=False),
    st.none(),
    st.text(max_size=3),
    st.builds(torch.ones, st.integers(0, 3)),
)
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
    ),
    max_leaves=8,
)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(st.lists(trees, max_size=4).map(tuple), st.dictionaries(st.text(max_size=3), trees))
def test_call_arguments_flatten_as_torch_does(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    flat, spec = flatten_call(args, kwargs)
    assert same(flat, tree_flatten((args, kwargs))[0])
    rebuilt = unflatten(flat, spec)
    assert same(rebuilt[0], args) and same(rebuilt[1], kwargs)


@given(trees)
def test_results_flatten_as_torch_does(result: Any) -> None:
    flat, spec = flatten(result)
    assert same(flat, tree_flatten(result)[0])
    assert same(unflatten(flat, spec), result)
