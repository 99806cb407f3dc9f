"""``remote``: a free function run by every worker on its shards, as one recorded op
(``fn(...)``: monarch Tensors), or with the endpoint adverbs (``fn.call(...)``: values)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import torch

from monarch.core import Future, ValueMesh, context, dumps

from ._active import current_client
from ._client import MeshClient
from ._commands import CALL, Pickled, Ref
from ._flat import flatten_call, unflatten
from ._tensor import Tensor, dispatch

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
        """Run on every proc; the result is monarch Tensors (upstream's ``rref``)."""
        result = dispatch(
            self._fn, args, kwargs, current_client(), self._propagate, wire=self._wired()
        )
        return result  # type: ignore[no-any-return]

    rref = __call__

    # -- the endpoint adverbs: results come back as values (any picklable object) -------

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Run on every proc of the active mesh; each proc's result, gathered."""
        client, ref = self._record_call(args, kwargs)

        def values(found: ValueMesh[list[Any]]) -> ValueMesh[R]:
            return ValueMesh(found.shape, [value[0] for value in found.values()])

        future = client.fetch_all([ref]).then(values)
        client.free(ref)  # deleted with a later batch: after the fetch, in each worker's order
        return future

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Run on the active mesh, which must have one proc; its result."""
        client = self._client()
        procs = math.prod(client.sizes)
        if procs != 1:
            raise ValueError(
                f"call_one needs an active mesh of one proc; this one has {procs} "
                f"({dict(zip(client.labels, client.sizes, strict=True))}): slice it, or use call()"
            )
        return self._from_rank(0, args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run on every proc of the active mesh, for its effects; nothing comes back."""
        client, ref = self._record_call(args, kwargs)
        client.free(ref)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Run on every proc of the active mesh; a future of each proc's result, by rank."""
        client, ref = self._record_call(args, kwargs)
        futures = [
            client.fetch([ref], rank).then(_first) for rank in range(math.prod(client.sizes))
        ]
        client.free(ref)
        return iter(futures)

    def _from_rank(self, rank: int, args: Any, kwargs: Any) -> Future[R]:
        client, ref = self._record_call(args, kwargs)
        future = client.fetch([ref], rank).then(_first)
        client.free(ref)
        return future

    def _client(self) -> MeshClient:
        client = current_client()
        if client is None:
            raise ValueError(
                "calling a remote function needs an active mesh: `with proc_mesh.activate():`"
            )
        return client

    def _record_call(self, args: Any, kwargs: Any) -> tuple[MeshClient, int]:
        """Record the function's run on the active mesh, its result held under a new id."""
        client = self._client()
        flat, spec = flatten_call(args, kwargs)
        if any(isinstance(x, Tensor) and x._client is not client for x in flat):
            raise ValueError("a monarch.Tensor of another mesh than the active one")
        wired = [Ref(x._ref) if isinstance(x, Tensor) else x for x in flat]
        wire_args, wire_kwargs = unflatten(wired, spec)
        ref = client.new_id()
        grad = torch.is_grad_enabled()
        client.record((CALL, ref, self._wired(), wire_args, wire_kwargs, grad))
        return client, ref

    def _wired(self) -> Pickled:
        if self._wire is None:
            name = str(getattr(self._fn, "__qualname__", self._fn))
            self._wire = Pickled(name, [bytes(part) for part in dumps(self._fn)])
        return self._wire

    def __repr__(self) -> str:
        return f"remote({getattr(self._fn, '__qualname__', self._fn)!r})"


def _first(values: list[Any]) -> Any:
    return values[0]


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
