"""Upstream's gradient helpers: ``grad_generator`` (the gradients of some tensors, one at a
time) and ``grad_function`` (a function that says its own backward)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ._active import current_client
from ._flat import flatten_call
from ._remote import Remote
from ._tensor import Tensor


def grad_generator(
    roots: torch.Tensor | Sequence[Any] = (),
    with_respect_to: Sequence[Any] = (),
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> Iterator[torch.Tensor | None]:
    """The gradients of ``roots`` (seeded with ``grad_roots``, where given) with respect to
    each of ``with_respect_to``, in that order; None for one the roots do not use.

    Upstream's runs autograd a step at a time so that each gradient is there (to reduce,
    say) before the next is computed. Here the first ``next()`` runs one
    ``torch.autograd.grad`` for all of them (on the workers, for monarch Tensors: one
    recorded op, so the gradients' reductions still overlap nothing but later ops)."""
    outputs = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    inputs = list(with_respect_to)
    seeds: list[torch.Tensor | None] | None = list(grad_roots) or None
    if seeds is not None and len(seeds) != len(outputs):
        raise ValueError(f"{len(seeds)} grad_roots for {len(outputs)} roots")
    if not inputs:
        return
    meshed = [t for t in (*outputs, *inputs) if isinstance(t, Tensor)]
    stream = meshed[0]._stream.activate() if meshed else _Nothing()
    with stream:
        grads = torch.autograd.grad(outputs, inputs, seeds, allow_unused=True)
    yield from grads


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Continued(torch.autograd.Function):
    """``fn(*args)`` returns ``(result, backward)``: ``backward(*grads)`` gives the gradients
    of the arguments (a tuple, or one tensor for one argument)."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[..., Any], *args: Any) -> Any:
        result, backward = fn(*args)
        ctx.continuation = backward
        return result

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        found = ctx.continuation(*grads)
        return (None, *found) if isinstance(found, tuple) else (None, found)


def _continued(fn: Callable[..., Any], *args: Any) -> Any:
    return _Continued.apply(fn, *args)  # type: ignore[no-untyped-call]


def grad_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as an autograd function that says its own backward (upstream's
    ``monarch.grad_function``): ``fn(*args)`` returns ``(result, backward)``, a closure
    that maps the result's gradients to the arguments'. With monarch Tensors (or inside
    ``activate()``) it runs on the workers, as one op whose backward is theirs."""
    on_mesh: Remote[Any] = Remote(functools.partial(_continued, fn), None)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        flat, _ = flatten_call(args, {})
        if current_client() is not None or any(isinstance(x, Tensor) for x in flat):
            return on_mesh(*args)
        return _continued(fn, *args)

    return call
