"""Result metadata of an op, remembered by the metadata of its inputs.

torch's meta kernels are mostly Python decompositions: about a millisecond an op, which
would cap a controller at a thousand ops a second. The second time an op meets inputs of
the same shapes, strides and dtypes, its results' metadata comes from here instead.
Only what cannot change the meaning is cached: no in-place op (its name ends in ``_``),
no autograd (an input that requires grad needs the meta graph for ``backward``), no result
that aliases an input, no user function (its propagation may not be a pure function).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

LIMIT = 4096
"""Entries kept (a program uses a few hundred distinct op signatures at most); when full,
the cache is cleared."""

_cache: dict[Hashable, tuple[Any, list[Any]]] = {}
_ALWAYS = frozenset({"__getitem__"})


def key_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], flat: list[Any]) -> Any:
    """The cache key of this call, or None when it must run on meta tensors."""
    name = getattr(func, "__name__", "")
    if (name.endswith("_") and name not in _ALWAYS) or "out" in kwargs:
        return None
    grad = torch.is_grad_enabled()
    parts: list[Any] = [
        func,
        torch.get_default_dtype(),
        grad,
        tuple(len(a) if isinstance(a, (list, tuple)) else -1 for a in args),
        tuple(kwargs),
    ]
    for leaf in flat:
        if isinstance(leaf, torch.Tensor):
            meta = leaf._meta if hasattr(leaf, "_meta") else leaf
            if grad and meta.requires_grad:
                return None
            parts.append(
                (meta.shape, meta.stride(), meta.storage_offset(), meta.dtype, meta.requires_grad)
            )
        else:
            parts.append((type(leaf), leaf))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:  # an unhashable argument (a slice before Python 3.12, a list)
        return None
    return key


def lookup(key: Any) -> list[Any] | None:
    """Fresh results (meta tensors made from the cached metadata) and their tree spec."""
    found = _cache.get(key)
    if found is None:
        return None
    spec, described = found
    leaves = [
        torch.empty_strided(d[1], d[2], dtype=d[3], device="meta").requires_grad_(d[4])
        if isinstance(d, tuple) and d and d[0] is _TENSOR
        else d
        for d in described
    ]
    return [spec, leaves]


def store(key: Any, spec: Any, leaves: list[Any], inputs: set[int]) -> None:
    """Remember the metadata of ``leaves`` (unless one aliases an input or is offset)."""
    described: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if id(leaf) in inputs or leaf.storage_offset() != 0:
                return
            described.append(
                (_TENSOR, tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.requires_grad)
            )
        else:
            described.append(leaf)
    if len(_cache) >= LIMIT:
        _cache.clear()
    _cache[key] = (spec, described)


class _Tensor:
    """Marks a tensor's description among the cached leaves."""


_TENSOR = _Tensor()
