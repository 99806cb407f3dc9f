"""``remote``: a free function run by every worker on its shards, as one recorded op
(``fn(...)``: monarch Tensors), or with the endpoint adverbs (``fn.call(...)``: values)."""

from __future__ import annotations

import functools
import importlib
import math
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from monarch.core import Future, ValueMesh, context, dumps

from ._active import current_client
from ._client import MeshClient
from ._commands import Call, Pickled, Ref, Shaped
from ._flat import flatten, flatten_call, unflatten
from ._group import fake_group
from ._metacache import key_of
from ._tensor import Tensor, dispatch

R = TypeVar("R")


Propagate = Callable[..., Any] | Literal["cached", "inspect", "mocked"] | None
PROBE_WAIT = 120.0
"""Seconds a ``cached`` propagation waits for the first shard's run."""


class NeedsData(Exception):
    """``fn`` could not run on meta tensors (its result's shape depends on the values)."""


class Remote(Generic[R]):
    """``fn`` called on every proc of the mesh of its arguments (or the active mesh).

    Where its results are monarch Tensors (``fn(...)``), their shapes come from
    ``propagate``, as upstream's:

    - a callable: run here on meta tensors in place of ``fn``;
    - ``"cached"``: ``fn`` run once per signature of its arguments on the first proc, with
      that proc's shards, which says the shapes and dtypes of what it returns (``fn`` runs
      there twice: that once, and as the op); remembered per signature;
    - ``"inspect"``: ``fn`` returns no monarch Tensor (``fn(...)`` is None here), it runs
      for its effects;
    - ``None`` (ours): ``fn`` itself on meta tensors (no round trip), which works for any
      function of torch operations whose result's shape does not depend on the values;
      for one that does (a boolean mask, ``nonzero``, ``unique``), as ``"cached"``.

    Each proc's result must then have the shape the first proc's has: a worker whose result
    differs poisons it (the controller's tensor would be wrong there).
    """

    def __init__(self, fn: Callable[..., R], propagate: Propagate) -> None:
        if propagate == "mocked":
            raise NotImplementedError("mocked propagation")  # as upstream's
        if isinstance(propagate, str) and propagate not in ("cached", "inspect"):
            raise ValueError(f"propagate={propagate!r}: a callable, None, 'cached' or 'inspect'")
        self._fn = fn
        self._propagate = propagate
        self._wire: Pickled | None = None
        self._probed: dict[Any, Any] = {}
        self._needs_data: set[Any] = set()
        """Signatures whose meta run needed the values: probed at once from then on."""
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        """Run on every proc; the result is monarch Tensors (upstream's ``rref``)."""
        client, propagate = current_client(), self._propagate
        meta_func: Callable[..., Any]
        wire: Any = self._wired()
        if propagate == "inspect":
            meta_func = _nothing
        elif callable(propagate):
            meta_func = propagate
        elif propagate is None:
            key = self._key(args, kwargs) if self._needs_data else None
            if key is not None and key in self._needs_data:
                meta_func, wire = self._probe(args, kwargs)
            else:
                try:
                    return dispatch(  # type: ignore[no-any-return]
                        self._fn, args, kwargs, client, None, wire=wire, needs_data=NeedsData
                    )
                except NeedsData:  # its result's shape depends on the values: as "cached"
                    key = self._key(args, kwargs)
                    if key is not None:
                        self._needs_data.add(key)
                    meta_func, wire = self._probe(args, kwargs)
        else:
            meta_func, wire = self._probe(args, kwargs)
        return dispatch(self._fn, args, kwargs, client, meta_func, wire=wire)  # type: ignore[no-any-return]

    def _key(self, args: Any, kwargs: Any) -> Any:
        """The signature of a call (None where it has none: not cached)."""
        flat, _ = flatten_call(args, kwargs)
        return key_of(self._fn, args, kwargs, flat)

    def _probe(self, args: Any, kwargs: Any) -> tuple[Callable[..., Any], Shaped]:
        """What ``fn`` returns for arguments like these, as the first proc's run says: a
        stand-in for ``fn`` that makes those results of meta tensors, and ``fn`` as sent
        with those shapes, which every worker checks its own results against."""
        key = self._key(args, kwargs)
        found = _MISSING if key is None else self._probed.get(key, _MISSING)
        if found is _MISSING:
            describe = Remote(functools.partial(_described, self._fn), None)
            found = describe._from_rank(0, args, kwargs).get(timeout=PROBE_WAIT)
            if key is not None:
                self._probed[key] = found
        shapes = [
            (leaf.shape, leaf.dtype) for leaf in flatten(found)[0] if isinstance(leaf, _Described)
        ]
        return lambda *_args, **_kwargs: tree_map(_as_meta, found), Shaped(self._wired(), shapes)

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

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Run on one proc of the active mesh, picked at random (as upstream's ``choose``
        spreads calls over its actors); its result."""
        client = self._client()
        return self._from_rank(secrets.randbelow(math.prod(client.sizes)), args, kwargs)

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
        client.record(
            Call(func=self._wired(), args=wire_args, kwargs=wire_kwargs, grad=grad, out=ref)
        )
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


_MISSING: Any = object()


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


@dataclass(frozen=True)
class _Described:
    """A tensor result as the first proc's run of ``fn`` made it: what a meta one needs (a
    dataclass: a leaf of the result's tree, where a named tuple would be a node)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool


def _describe(leaf: Any) -> Any:
    if not isinstance(leaf, torch.Tensor):
        return leaf
    dtype = str(leaf.dtype).removeprefix("torch.")
    return _Described(tuple(leaf.shape), tuple(leaf.stride()), dtype, leaf.requires_grad)


def _described(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run on the first proc alone: ``fn``'s result with each tensor replaced by its
    description. A process group given to ``fn`` is replaced by one whose collectives do
    nothing (its peers do not run this)."""

    def alone(leaf: Any) -> Any:
        if isinstance(leaf, dist.ProcessGroup):
            return fake_group(leaf.rank(), leaf.size())
        return leaf

    args, kwargs = tree_map(alone, (args, kwargs))
    return tree_map(_describe, fn(*args, **kwargs))


def _as_meta(leaf: Any) -> Any:
    if not isinstance(leaf, _Described):
        return leaf
    made = torch.empty_strided(
        leaf.shape, leaf.stride, dtype=getattr(torch, leaf.dtype), device="meta"
    )
    return made.requires_grad_(leaf.requires_grad) if leaf.requires_grad else made


class ImportedFunction:
    """A function named by its path (``"package.module.function"``), imported where it is
    called: on the workers, from their own modules (upstream's ``remote("path")``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.__qualname__ = path

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, _, name = self.path.rpartition(".")
        found = getattr(importlib.import_module(module), name)
        if isinstance(found, Remote):  # a remote function's path: the function itself
            found = found._fn
        return found(*args, **kwargs)

    def __reduce__(self) -> tuple[type[ImportedFunction], tuple[str]]:
        return (ImportedFunction, (self.path,))


def _by_path(fn: Any) -> Callable[..., Any] | None:
    if isinstance(fn, str) and "." in fn:
        return ImportedFunction(fn)
    return None


function_resolvers: list[Callable[[Any], Callable[..., Any] | None]] = [_by_path]
"""How ``remote`` turns what it is given that is not callable into a function (upstream's
``monarch.function_resolvers``): each is tried in order, the first that does not return
None wins. The default one takes a dotted path, ``"package.module.function"``."""


@overload
def remote(fn: Callable[..., R], *, propagate: Propagate = None) -> Remote[R]: ...
@overload
def remote(fn: str, *, propagate: Propagate = None) -> Remote[Any]: ...
@overload
def remote(
    fn: None = None, *, propagate: Propagate = None
) -> Callable[[Callable[..., R]], Remote[R]]: ...
def remote(
    fn: Callable[..., R] | str | None = None, *, propagate: Propagate = None
) -> Remote[R] | Callable[[Callable[..., R]], Remote[R]]:
    """``remote(fn)``, ``remote("module.function")``, ``@remote`` or
    ``@remote(propagate=...)`` (see ``Remote``)."""
    if fn is None:
        return lambda f: Remote(f, propagate)
    return Remote(_resolved(fn), propagate)


def _resolved(fn: Any) -> Callable[..., Any]:
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    for resolver in function_resolvers:
        found = resolver(fn)
        if found is not None:
            return found
    raise TypeError(
        f"remote() takes a function or a dotted path to one ('module.function'), not {fn!r}"
    )


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
