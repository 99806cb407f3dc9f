"""Upstream's ``monarch.cached_remote_function``: ``remote_autograd_function(cls)`` runs a
``torch.autograd.Function`` on the workers. Here autograd runs on the workers already (a
monarch Tensor's graph is theirs), so the new class's ``apply`` records one op that calls
``cls.apply`` on each proc's shards: its forward there, and its backward there when the
program's ``backward()`` reaches it; its shapes come from ``cls.forward`` run on meta
tensors. With local tensors it is ``cls.apply``."""

from __future__ import annotations

import functools
import logging
from typing import Any

from torch import autograd

from monarch.tensor import Tensor, remote
from monarch.tensor._active import current_client
from monarch.tensor._flat import flatten_call

logger = logging.getLogger(__name__)


class RemoteAutogradFunction(autograd.Function):
    """What ``remote_autograd_function`` makes (call ``apply``)."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> Any:
        raise NotImplementedError("call apply()")

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise NotImplementedError("call apply()")


def _apply(target_class: type[autograd.Function], *args: Any) -> Any:
    return target_class.apply(*args)  # type: ignore[no-untyped-call]


def remote_autograd_function(
    target_class: type[autograd.Function], name: str | None = None
) -> type[RemoteAutogradFunction]:
    """``target_class`` (a ``torch.autograd.Function``) run on the workers."""
    if issubclass(target_class, RemoteAutogradFunction):
        logger.warning("%s is a remote autograd function already", target_class)
        return target_class
    if not issubclass(target_class, autograd.Function):
        raise TypeError(f"{target_class!r} is not a torch.autograd.Function")
    on_mesh = remote(functools.partial(_apply, target_class))

    def apply(*args: Any) -> Any:
        flat, _ = flatten_call(args, {})
        if current_client() is not None or any(isinstance(x, Tensor) for x in flat):
            return on_mesh(*args)
        return _apply(target_class, *args)

    made = type(
        name or f"Remote_{target_class.__name__}",
        (RemoteAutogradFunction,),
        {"apply": staticmethod(apply), "__module__": target_class.__module__},
    )
    return made


__all__ = ["RemoteAutogradFunction", "remote_autograd_function"]
