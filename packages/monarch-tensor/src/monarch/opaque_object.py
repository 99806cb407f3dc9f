"""Upstream's ``monarch.opaque_object``: ``OpaqueObject``, an object made and kept on every
proc (an ``OpaqueRef`` the controller holds), whose methods remote functions call."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import register_pytree_node

from monarch.tensor import Future, OpaqueRef, call_on_shard_and_fetch, remote


def _resolve(constructor: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(constructor):
        return constructor
    module, _, name = constructor.rpartition(".")
    if not module:
        raise ValueError(f"{constructor!r}: a callable or a dotted path 'module.name'")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found


def _construct(constructor: str | Callable[..., Any], *args: Any, **kwargs: Any) -> OpaqueRef:
    return OpaqueRef(_resolve(constructor)(*args, **kwargs))


def _invoke_method(obj: OpaqueRef, method_name: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(obj.value, method_name)(*args, **kwargs)


def _fresh_opaque_ref() -> OpaqueRef:
    """A stand-in for an ``OpaqueRef`` a remote function returns (for ``propagate``)."""
    return OpaqueRef._create(torch.empty((), dtype=torch.int64, device="meta"))


_construct_object = remote(_construct, propagate=lambda *args, **kwargs: _fresh_opaque_ref())


def opaque_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Declare a method of the remote object: ``fn``'s body is its shape propagation."""
    method_name = fn.__name__

    @functools.wraps(fn)
    def call(self: OpaqueObject, *args: Any, **kwargs: Any) -> Any:
        return self.call_method(method_name, fn, *args, **kwargs)

    return call


class OpaqueObject(OpaqueRef):
    """``OpaqueObject(constructor, *args, **kwargs)``: ``constructor(*args, **kwargs)`` (a
    callable or a dotted path the workers import) on every proc of the active mesh; or
    ``OpaqueObject(ref)`` for an ``OpaqueRef`` a remote function returned."""

    def __init__(self, constructor: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(constructor, OpaqueRef):
            self._key = constructor._key
        else:
            self._key = _construct_object(constructor, *args, **kwargs)._key

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _as_argument(cls)

    def call_method(
        self, method_name: str, propagation: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """``obj.method_name(*args, **kwargs)`` on every proc; its results' shapes are
        ``propagation(self, *args, **kwargs)``'s."""
        method = remote(
            _invoke_method,
            propagate=lambda obj, name, *a, **k: propagation(obj, *a, **k),
        )
        return method(self, method_name, *args, **kwargs)

    def call_method_on_shard_and_fetch(
        self, method_name: str, *args: Any, **kwargs: Any
    ) -> Future[Any]:
        """The method's result on one proc (``shard=`` picks it), as a value."""
        return call_on_shard_and_fetch(remote(_invoke_method), self, method_name, *args, **kwargs)


def _as_argument(cls: type[OpaqueObject]) -> None:
    """As an argument of a remote function, an object of ``cls`` is its key, as an
    ``OpaqueRef`` is (the workers see an ``OpaqueRef``)."""
    register_pytree_node(
        cls,
        lambda obj: ([obj._key], None),
        lambda keys, _: OpaqueRef._create(next(iter(keys))),
    )


_as_argument(OpaqueObject)

__all__ = ["OpaqueObject", "opaque_method"]
