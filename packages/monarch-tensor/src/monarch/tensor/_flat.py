"""Flattening an op's arguments and results: torch's pytree only where there is a container.

``tree_flatten``/``tree_unflatten`` cost tens of microseconds a call, several times an op on
each side, a good part of a small op's cost; most ops take tensors and scalars only
(``t + 1``) and return one tensor, which need no tree at all.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch.utils._pytree import SUPPORTED_NODES, tree_flatten, tree_unflatten


class _Call(NamedTuple):
    """The spec of ``(args, kwargs)`` made of leaves only."""

    positional: int
    keys: tuple[str, ...]


class _Leaf:
    """The spec of a lone leaf."""


LEAF = _Leaf()


def is_leaf(x: Any) -> bool:
    return not isinstance(x, (list, tuple, dict)) and type(x) not in SUPPORTED_NODES


def flatten_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
    """The leaves of ``(args, kwargs)`` and what ``unflatten`` needs to rebuild them."""
    if all(is_leaf(a) for a in args) and all(is_leaf(v) for v in kwargs.values()):
        return [*args, *kwargs.values()], _Call(len(args), tuple(kwargs))
    return tree_flatten((args, kwargs))


def flatten(obj: Any) -> tuple[list[Any], Any]:
    """The leaves of ``obj`` and its spec."""
    if is_leaf(obj):
        return [obj], LEAF
    return tree_flatten(obj)


def unflatten(leaves: list[Any], spec: Any) -> Any:
    """Inverse of ``flatten`` and ``flatten_call``."""
    if spec is LEAF:
        return leaves[0]
    if isinstance(spec, _Call):
        n = spec.positional
        return tuple(leaves[:n]), dict(zip(spec.keys, leaves[n:], strict=True))
    return tree_unflatten(leaves, spec)
