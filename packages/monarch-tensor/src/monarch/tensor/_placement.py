"""Which device a monarch Tensor's shards are on, as the controller knows it.

The controller computes on meta tensors, which have no device; a ``Tensor`` carries the
one its shards have on the workers (each worker sees its own GPU as ``cuda:0``, see
``_devices``): a factory's ``device=`` (or the default device), a move's target
(``.cuda()``, ``.cpu()``, ``.to(...)``), else its inputs' (a GPU input wins over a CPU
scalar, as torch's). ``t.device`` and ``t.is_cuda`` answer from it, and ``x.to(y.device)``
sends the right device to the workers.

A move to another device is recorded as ``Tensor.to(device, copy=True)``: the result is a
new tensor on every worker, as the controller counts it, also where the mocked engine runs
CUDA on the CPU (there ``.cpu()`` of a CPU tensor would return the tensor itself).
"""

from __future__ import annotations

from typing import Any, Final

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext

CPU: Final = torch.device("cpu")


def default_is_cuda() -> bool:
    """Whether ``torch.set_default_device`` (or ``with torch.device(...)``) made CUDA the
    default (its mode says so; ``torch.get_default_device()`` would initialize CUDA, and
    fail without it)."""
    return any(
        isinstance(mode, DeviceContext) and torch.device(mode.device).type == "cuda"
        for mode in _get_current_function_mode_stack()  # type: ignore[no-untyped-call]
    )


def device_of(value: object) -> torch.device | None:
    """``value`` as a device (``"cuda"`` and ``0`` are ``cuda:0``: each worker's own GPU);
    None where it names none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return torch.device("cuda", value)
    if isinstance(value, (str, torch.device)):
        try:
            device = torch.device(value)
        except RuntimeError:
            return None
        return torch.device("cuda", device.index or 0) if device.type == "cuda" else device
    return None


def placed(kwargs: dict[str, Any], inputs: list[torch.device]) -> torch.device:
    """Where an op's results are: its ``device=``, else its inputs' (the first not on the
    CPU), else the default device."""
    given = device_of(kwargs.get("device"))
    if given is not None:
        return given
    if inputs:
        return next((d for d in inputs if d.type != "cpu"), inputs[0])
    return torch.device("cuda", 0) if default_is_cuda() else CPU


_MOVES: Final = {torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda}


def as_move(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], here: torch.device
) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """``(func, args, kwargs)`` of a device move of a tensor on ``here``, rewritten as
    ``Tensor.to`` with keywords alone (a new tensor where the device changes); None if
    ``func`` is not a move. ``x.to(y)`` moves to ``y``'s device (its ``_device`` where
    ``y`` is a monarch Tensor) and dtype."""
    if func not in _MOVES or not args:
        return None
    self, rest = args[0], list(args[1:])
    options = dict(kwargs)
    target: torch.device | None = None
    if func is torch.Tensor.cpu:
        target = CPU
    elif func is torch.Tensor.cuda:
        index = options.pop("device", rest.pop(0) if rest else None)
        target = device_of(index if index is not None else "cuda")
    else:
        if rest and isinstance(rest[0], torch.Tensor):  # x.to(other): its device and dtype
            other = rest.pop(0)
            target = getattr(other, "_device", None) or other.device
            options.setdefault("dtype", other.dtype)
        elif rest and not isinstance(rest[0], torch.dtype):
            target = device_of(rest.pop(0))
        if rest and isinstance(rest[0], torch.dtype):
            options["dtype"] = rest.pop(0)
        for name, value in zip(("non_blocking", "copy"), rest, strict=False):
            options[name] = value
        if "device" in options:
            target = device_of(options.pop("device"))
    if target is not None and target != here:
        options["device"] = target
        options["copy"] = True
    return torch.Tensor.to, (self,), options


NOT_A_QUERY: Final = object()


def query(func: Any, device: torch.device) -> object:
    """The answer to a question about a tensor's device (``t.device``, ``t.is_cuda``,
    ``t.is_cpu``, ``t.get_device()``) for a tensor on ``device``; ``NOT_A_QUERY`` else."""
    owner = getattr(func, "__self__", None)
    name = getattr(owner, "__name__", None) if func.__name__ == "__get__" else func.__name__
    if name == "device":
        return device
    if name == "is_cuda":
        return device.type == "cuda"
    if name == "is_cpu":
        return device.type == "cpu"
    if name == "get_device":
        return device.index if device.type == "cuda" else -1
    return NOT_A_QUERY
