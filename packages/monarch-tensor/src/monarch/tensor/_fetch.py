"""Bringing values back: ``fetch_shard`` (a Future), ``inspect`` and ``show`` (blocking)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch.core import Future

from ._active import current_client, pushed
from ._flat import flatten_call
from ._remote import Remote
from ._tensor import Tensor


def fetch_shard(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Future[Any]:
    """The value of ``obj`` (a monarch Tensor, or any pytree of them) on one proc: the one
    at ``shard``/``coords`` (missing dimensions are 0). Sends what is buffered; the future
    raises ``RemoteException`` if the value depends on an operation that failed there."""
    leaves, spec = tree_flatten(obj)
    tensors = [x for x in leaves if isinstance(x, Tensor)]
    if not tensors:
        return Future._of(obj)
    clients = {t._client for t in tensors}
    if len(clients) > 1:
        raise ValueError("fetch_shard of monarch Tensors of different meshes")
    client = clients.pop()
    rank = client.rank_of({**(shard or {}), **coords})

    def rebuild(values: list[Any]) -> Any:
        it = iter(values)
        return tree_unflatten([next(it) if isinstance(x, Tensor) else x for x in leaves], spec)

    return client.fetch([t._ref for t in tensors], rank).then(rebuild)


def call_on_shard_and_fetch(
    fn: Callable[..., Any], *args: Any, shard: dict[str, int] | None = None, **kwargs: Any
) -> Future[Any]:
    """Run remote function ``fn`` on the mesh (the active one, else its tensors') and fetch
    its result, any value, from ``shard``."""
    if not isinstance(fn, Remote):
        return fetch_shard(fn(*args, **kwargs), shard)
    client = current_client()
    if client is None:
        tensors = [x for x in flatten_call(args, kwargs)[0] if isinstance(x, Tensor)]
        if not tensors:
            raise ValueError("call_on_shard_and_fetch needs an active mesh or a monarch Tensor")
        client = tensors[0]._client
    with pushed(client):
        return fn._from_rank(client.rank_of(shard or {}), args, kwargs)


def inspect(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """``fetch_shard(...).result()``: the value, waiting for it."""
    return fetch_shard(obj, shard, **coords).result()


def show(obj: Any, shard: dict[str, int] | None = None, **coords: int) -> None:
    """Print ``inspect(...)``."""
    print(inspect(obj, shard, **coords))
