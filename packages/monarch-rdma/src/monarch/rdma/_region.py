"""Local memory as (address, size): what a buffer registers and a transfer reads or fills.

Everything the planes do is in terms of addresses: a torch tensor offers no buffer
protocol without numpy, and the shared-memory plane copies between processes by address
anyway. A ``Region`` keeps the object that owns the memory alive (for a memoryview, the
view itself, which also stops a bytearray from being resized under it).
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from monarch.core import buffer_address


@dataclass(frozen=True, slots=True)
class Region:
    address: int
    size: int
    writable: bool
    keep: object
    """The object whose memory this is, held so it stays where ``address`` says."""

    def view(self, offset: int = 0, size: int | None = None) -> memoryview:
        """A writable (if the memory is) byte view of ``size`` bytes at ``offset``."""
        length = self.size - offset if size is None else size
        if length == 0:
            return memoryview(b"")
        return memoryview((ctypes.c_char * length).from_address(self.address + offset)).cast("B")


def is_tensor(data: object) -> bool:
    """Whether ``data`` is a torch tensor (torch is never imported here)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(data, torch.Tensor)


def check_flat(tensor: Any, what: str) -> None:
    """ValueError unless ``tensor`` is 1-D and contiguous (what a buffer or a transfer's
    local memory must be)."""
    if tensor.dim() != 1 or not tensor.is_contiguous():
        raise ValueError(
            f"{what}: the tensor must be 1-D and contiguous "
            f"(got shape {tuple(tensor.shape)}); use tensor.view(torch.uint8).flatten()"
        )


def tensor_region(tensor: Any, what: str) -> Region:
    """The memory of a 1-D contiguous tensor (on the CPU: see ``_staging`` for a GPU's)."""
    check_flat(tensor, what)
    size = tensor.numel() * tensor.element_size()
    return Region(tensor.data_ptr(), size, True, tensor)


def region_of(data: object, what: str = "data") -> Region:
    """The memory of a 1-D contiguous CPU tensor or a contiguous buffer (memoryview,
    bytearray, bytes, anything with the buffer protocol); ValueError/TypeError otherwise."""
    if is_tensor(data):
        tensor: Any = data
        if tensor.device.type != "cpu":
            raise ValueError(
                f"{what}: a tensor on {tensor.device} is not supported here (CPU tensors "
                "are; CUDA ones too as a buffer, and in read_into and write_from)"
            )
        return tensor_region(tensor, what)
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{what} must be a torch.Tensor or support the buffer protocol "
            f"(memoryview, bytearray), not {type(data).__name__}"
        ) from None
    if view.ndim != 1 or not view.c_contiguous:
        raise ValueError(f"{what}: the buffer must be 1-D and contiguous (ndim {view.ndim})")
    address = buffer_address(view) if view.nbytes else 0
    return Region(address, view.nbytes, not view.readonly, view)
