"""``remote``: a free function run by every worker on its shards, as one recorded op."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, overload

import torch

from monarch.core import context, dumps

from ._active import current_client
from ._commands import Pickled
from ._tensor import dispatch

R = TypeVar("R")


class Remote(Generic[R]):
    """``fn`` called on every proc of the mesh of its arguments (or the active mesh).

    The result's shapes come from ``propagate(*args)`` run here on meta tensors; by
    default ``fn`` itself is run on meta tensors, which works for any function written
    with torch operations only.
    """

    def __init__(self, fn: Callable[..., R], propagate: Callable[..., Any] | None) -> None:
        self._fn = fn
        self._propagate = propagate
        self._wire: Pickled | None = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if self._wire is None:
            name = str(getattr(self._fn, "__qualname__", self._fn))
            self._wire = Pickled(name, [bytes(part) for part in dumps(self._fn)])
        result = dispatch(
            self._fn, args, kwargs, current_client(), self._propagate, wire=self._wire
        )
        return result  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"remote({getattr(self._fn, '__qualname__', self._fn)!r})"


@overload
def remote(fn: Callable[..., R], *, propagate: Callable[..., Any] | None = None) -> Remote[R]: ...
@overload
def remote(
    fn: None = None, *, propagate: Callable[..., Any] | None = None
) -> Callable[[Callable[..., R]], Remote[R]]: ...
def remote(
    fn: Callable[..., R] | None = None, *, propagate: Callable[..., Any] | None = None
) -> Remote[R] | Callable[[Callable[..., R]], Remote[R]]:
    """``remote(fn)``, ``@remote`` or ``@remote(propagate=...)``."""
    if fn is None:
        return lambda f: Remote(f, propagate)
    if isinstance(propagate, str):
        raise NotImplementedError(f"propagate={propagate!r}: only a callable or None for now")
    return Remote(fn, propagate)


def _rank_along(label: str) -> torch.Tensor:
    return torch.tensor(context().message_rank[label])


def _rank_meta(label: str) -> torch.Tensor:
    return torch.empty((), dtype=torch.long, device="meta")


_rank = Remote(_rank_along, _rank_meta)


def rank_tensor(dim: str | Sequence[str]) -> Any:
    """A 0-d int64 tensor holding each proc's coordinate along mesh dimension ``dim`` (along
    several dimensions: the proc's row-major rank over them, as upstream's)."""
    client = current_client()
    if client is None:
        raise RuntimeError("rank_tensor needs an active mesh: use `with proc_mesh.activate():`")
    dims = [dim] if isinstance(dim, str) else list(dim)
    for d in dims:
        if d not in client.labels:
            raise ValueError(f"{d!r} is not a dimension of the mesh {client.labels}")
    combined: Any = _rank(dims[0]) if dims else torch.zeros((), dtype=torch.long)
    for d in dims[1:]:
        combined = combined * client.sizes[client.labels.index(d)] + _rank(d)
    return combined


def rank_tensors() -> dict[str, Any]:
    """``rank_tensor`` of every dimension of the active mesh."""
    client = current_client()
    if client is None:
        raise RuntimeError("rank_tensors needs an active mesh: use `with proc_mesh.activate():`")
    return {label: rank_tensor(label) for label in client.labels}
