"""torch tensors in messages: their memory as one out-of-band buffer, torch never imported here.

torch's own pickling of a tensor runs ``torch.save`` into a ``bytes`` (a zip archive)
and back: several copies and a parse. Here a CPU tensor travels as its dtype, shape,
strides and one buffer holding its elements, which the transport sends (or lends) like
any large buffer, and which the receiver's tensor is built on without a copy.

The buffer is a copy made when the message is sent, as upstream's pickle is: a sender
may change the tensor in place as soon as ``send`` or ``call`` returns (an optimizer step
after sending the weights) without the receiver seeing torn values. In a call (or a reply)
to one process of this machine, a large dense tensor's copy is made while the tensor
travels, before the call returns (see ``_filling``). A dense layout
(contiguous, channels-last, any permutation) keeps its strides; any other is made
contiguous by that same copy.

Received, the tensor is built on the buffer itself when the buffer is writable, is this
message's alone (read from a socket or from another process) and is aligned for the
dtype; otherwise (a small frame's read-only bytes, a message delivered within the process
that sent it, where several receivers may share one buffer) it gets a copy of its own.

Only exact ``torch.Tensor`` instances on the CPU with a strided layout take this path
(``Parameter`` and other subclasses reduce to one); CUDA, sparse, quantized, nested and
tensors carrying Python attributes keep torch's reduction.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
from typing import Any, Final

from . import _memory as memory
from ._filling import DEFER_MIN, MARKER_SIZE, deferring, new_filling

_DENSE_MIN: Final = 2
"""Dimensions from which a non-contiguous dense layout is worth keeping as is."""


def tensor_type() -> type | None:
    """``torch.Tensor`` when the user has imported torch (the core never imports it)."""
    torch = sys.modules.get("torch")
    return None if torch is None else getattr(torch, "Tensor", None)


def _dense_strides(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether elements at ``stride`` fill ``numel`` slots with no gap and no overlap."""
    expected = 1
    for size, step in sorted(zip(shape, stride, strict=True), key=lambda d: d[1]):
        if size == 1:
            continue
        if step != expected:
            return False
        expected *= size
    return True


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def reduce_tensor(tensor: Any) -> tuple[Any, ...] | None:
    """The reduction of a CPU tensor, or None for torch's own."""
    torch = sys.modules["torch"]
    if (
        tensor.device.type != "cpu"
        or tensor.layout is not torch.strided
        or tensor.is_quantized
        or tensor.is_nested
        or tensor.__dict__
    ):
        return None
    requires_grad = bool(tensor.requires_grad)
    source = tensor.detach()
    if source.is_conj():
        source = source.resolve_conj()
    if source.is_neg():
        source = source.resolve_neg()
    shape = tuple(source.shape)
    stride = tuple(source.stride())
    if len(shape) < _DENSE_MIN or not _dense_strides(shape, stride):
        stride = _contiguous_strides(shape)
    numel = source.numel()
    size = numel * source.element_size()
    data: bytearray | memoryview
    if size >= DEFER_MIN and stride == tuple(source.stride()) and deferring():
        # its elements lie as they will travel: copied while they do (see ``_filling``)
        snapshot = memory.fresh_bytearray(size + MARKER_SIZE)
        base = memory.address_of(snapshot)
        data = new_filling(snapshot, base, source, source.data_ptr()).view
    else:
        data = memory.fresh_bytearray(size)
        if numel:
            target = torch.frombuffer(data, dtype=source.dtype, count=numel)
            target.as_strided(shape, stride).copy_(source)
    dtype = str(source.dtype).removeprefix("torch.")
    args = (pickle.PickleBuffer(data), dtype, shape, stride, requires_grad, os.getpid())
    return rebuild_tensor, args


def _owned(view: memoryview, itemsize: int, sender: int) -> bool:
    """Whether a tensor may be built on ``view`` as it is."""
    if view.readonly or sender == os.getpid() or not memory.available():
        return False
    return memory.address_of(view) % itemsize == 0


def rebuild_tensor(
    buffer: Any,
    dtype: str,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool,
    sender: int,
) -> Any:
    """Inverse of :func:`reduce_tensor`: a tensor on the received buffer (see the module)."""
    torch = importlib.import_module("torch")
    kind = getattr(torch, dtype)
    view = memoryview(buffer).cast("B")
    if view.nbytes == 0:
        tensor = torch.empty_strided(shape, stride, dtype=kind)
    else:
        itemsize = kind.itemsize
        if not _owned(view, itemsize, sender):
            own = memory.fresh_bytearray(view.nbytes)
            memory.copy_into(own, view)
            view = memoryview(own)
        flat = torch.frombuffer(view, dtype=kind, count=view.nbytes // itemsize)
        tensor = flat.as_strided(shape, stride)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor
