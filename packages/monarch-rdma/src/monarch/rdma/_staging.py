"""GPU memory in RDMA buffers, through host copies (no GPUDirect here).

An ``RDMABuffer`` of a CUDA tensor registers two host buffers of its size beside it:
*out*, which readers read (the handle's own buffer), and *in*, which writers write (the
handle's ``inbox``). Before a read the owner copies the GPU bytes to *out*; after a write
it copies *in* to the GPU (``Stage``: asked of the owner through its ``rdma`` service, or
done at once by the owner itself). Two host buffers, not one, so that a read staged while
another process's write is on its way cannot overwrite that write before it lands; their
pages are only touched (and only count) once a read or a write uses them.

On the other side, a CUDA tensor given to ``read_into``/``write_from`` goes through a
host buffer of the transfer's size (``bounce``): the bytes are copied to the GPU after the
read ends, or from it when the write is asked for (as upstream's pickled tensors are).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from ._errors import RDMABufferDropped, RDMAError
from ._region import Region, check_flat, is_tensor, tensor_region
from ._registry import registry


def is_gpu_tensor(data: object) -> bool:
    return is_tensor(data) and data.device.type == "cuda"  # type: ignore[attr-defined]


def _bytes_of(tensor: Any) -> Any:
    """The tensor's memory as a flat uint8 tensor (checked 1-D and contiguous)."""
    import torch

    check_flat(tensor, "data")
    return tensor.detach().view(torch.uint8) if tensor.numel() else tensor.new_empty(0)


@dataclass(frozen=True, slots=True)
class Staged:
    """A registered GPU buffer at its owner: its bytes and its two host copies."""

    device: Any
    out: Any
    inbox: Any
    inbox_id: int
    lock: threading.Lock


class Staging:
    """The GPU buffers registered in this process, by the id of their *out* buffer."""

    def __init__(self) -> None:
        self._buffers: dict[int, Staged] = {}

    def host_copies(self, tensor: Any) -> tuple[Any, Region, Region]:
        """The GPU bytes of ``tensor``, and the regions of new *out* and *in* host
        buffers of their size (not yet registered)."""
        import torch

        device = _bytes_of(tensor)
        out = torch.empty(device.numel(), dtype=torch.uint8)
        inbox = torch.empty(device.numel(), dtype=torch.uint8)
        return device, tensor_region(out, "data"), tensor_region(inbox, "data")

    def add(self, buffer_id: int, device: Any, out: Region, inbox: Region, inbox_id: int) -> None:
        self._buffers[buffer_id] = Staged(device, out.keep, inbox.keep, inbox_id, threading.Lock())

    def forget(self, buffer_id: int) -> int | None:
        """Forget a dropped buffer; the id of its *in* buffer (to drop too), or None."""
        staged = self._buffers.pop(buffer_id, None)
        return None if staged is None else staged.inbox_id

    def get(self, buffer_id: int) -> Staged | None:
        return self._buffers.get(buffer_id)

    def stage(self, buffer_id: int, way: Literal["out", "in"], size: int) -> None:
        """Copy the first ``size`` bytes GPU → *out* (before a read) or *in* → GPU (after a
        write), and wait for the copy (a reader reads *out* as soon as this returns)."""
        staged = self._buffers.get(buffer_id)
        if staged is None:
            if registry.get(buffer_id) is None:
                raise RDMABufferDropped("the buffer was dropped")
            raise RDMAError("the buffer is not staged through host copies (not a GPU's)")
        import torch

        gpu = staged.device.device.type == "cuda"
        with staged.lock, torch.cuda.device(staged.device.device) if gpu else nullcontext():
            if way == "out":
                staged.out[:size].copy_(staged.device[:size])
            else:
                staged.device[:size].copy_(staged.inbox[:size])
            if gpu:  # the copy is queued on the device's stream: wait for it
                torch.cuda.current_stream().synchronize()


staging = Staging()
"""This process's GPU buffers."""


def bounce(data: Any, what: str, fill: bool) -> tuple[Region, Callable[[], None] | None]:
    """A host region standing for the GPU tensor ``data`` in a transfer: holding its bytes
    now (``fill``: a write's source), or to be copied to it once the read ends (the
    callable returned)."""
    device = _bytes_of(data)
    if fill:
        return tensor_region(device.cpu(), what), None
    import torch

    host = torch.empty(device.numel(), dtype=torch.uint8)

    def land() -> None:
        device.copy_(host)
        torch.cuda.current_stream(device.device).synchronize()

    return tensor_region(host, what), land


def _drop_inbox(buffer_id: int) -> None:
    """A dropped GPU buffer's *in* copy goes with it."""
    inbox_id = staging.forget(buffer_id)
    if inbox_id is not None:
        registry.drop(inbox_id)


registry.on_drop.append(_drop_inbox)
