"""Upstream's ``monarch.opaque_module``: ``OpaqueModule``, a ``torch.nn.Module`` made and
kept on every proc, called from the controller with monarch Tensors.

Autograd runs on the workers here (a monarch Tensor's graph is theirs), so a call runs the
module itself there, its output's graph reaching the module's parameters; ``parameters()``
are those parameters as monarch Tensors (the workers' own), so ``loss.backward()`` fills
their ``.grad`` and an optimizer on the controller steps them. The output's shapes come
from ``propagator(self, *args, **kwargs)``, as upstream's, linked on the controller to the
parameters and the inputs that need gradients, so the controller's graph has their edges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from monarch.opaque_object import OpaqueObject, _invoke_method
from monarch.tensor import OpaqueRef, call_on_shard_and_fetch, remote


def _parameter_shapes(module: OpaqueRef) -> list[tuple[torch.Size, torch.dtype]]:
    return [(p.shape, p.dtype) for p in module.value.parameters()]


def _parameters(module: OpaqueRef) -> list[torch.Tensor]:
    return list(module.value.parameters())


def _forward(module: OpaqueRef, parameters: list[torch.Tensor], args: Any, kwargs: Any) -> Any:
    """The module's call on a worker (``parameters`` are its own: they ride along only so
    the controller's graph links the output to them)."""
    return module.value(*args, **kwargs)


def _linked(result: Any, sources: list[torch.Tensor]) -> Any:
    """``result`` (meta tensors) as depending on ``sources`` for autograd: adds a zero that
    touches each, so the controller's graph has an edge from every output to them."""
    needing = [s for s in sources if s.requires_grad]
    if not needing or not torch.is_grad_enabled():
        return result
    zero = sum((s.sum() * 0 for s in needing), torch.zeros((), device="meta"))

    def link(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x + zero.to(x.dtype)
        return x

    return tree_map(link, result)


class OpaqueModule:
    """``OpaqueModule("torch.nn.Linear", 3, 3)``: the module made on every proc of the
    active mesh (a constructor or its dotted path, then its arguments).
    ``m(x, propagator=lambda self, x: ...)`` calls it; ``m.parameters()`` are its
    parameters; ``m.call_method(name, propagation, *args)`` any of its methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._object = OpaqueObject(*args, **kwargs)
        self._parameters: list[Any] | None = None

    def parameters(self) -> list[Any]:
        if self._parameters is None:
            shapes = call_on_shard_and_fetch(remote(_parameter_shapes), self._object).get()
            made = remote(
                _parameters,
                propagate=lambda module: [
                    torch.empty(shape, dtype=dtype, device="meta").requires_grad_(True)
                    for shape, dtype in shapes
                ],
            )(self._object)
            self._parameters = list(made)
        return self._parameters

    def call_method(
        self, method_name: str, propagation: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        return self._object.call_method(method_name, propagation, *args, **kwargs)

    def __call__(self, *args: Any, propagator: Callable[..., Any], **kwargs: Any) -> Any:
        parameters = self.parameters()

        def shapes(module: Any, params: list[Any], a: Any, k: Any) -> Any:
            inputs = [x for x in tree_flatten((a, k))[0] if isinstance(x, torch.Tensor)]
            return _linked(propagator(module, *a, **k), [*params, *inputs])

        return remote(_forward, propagate=shapes)(self._object, parameters, args, kwargs)


__all__ = ["OpaqueModule"]
_ = _invoke_method  # the workers import it from here too (upstream's module has it)
