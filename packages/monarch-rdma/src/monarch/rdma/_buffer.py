"""``RDMABuffer``: registered memory as a small handle that any actor can read or write."""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

from monarch.core import Future, context, timed
from monarch.core.lowlevel import bulk_planes

from . import _transfer as transfer
from ._backend import get_rdma_backend
from ._errors import RDMATcpFallbackWarning
from ._handle import Handle
from ._process import local_process
from ._region import Region, region_of
from ._registry import registry
from ._staging import is_gpu_tensor, staging

if TYPE_CHECKING:
    import torch

    LocalMemory = torch.Tensor | memoryview | bytearray | bytes

log = logging.getLogger("monarch.rdma")

FALLBACK = (
    "No ibverbs RDMA hardware detected. Falling back to TCP transport (shared memory "
    "between processes of one host), which has lower throughput and higher latency than "
    "native RDMA between hosts. To disable this fallback and fail explicitly, call "
    "monarch.configure(rdma_allow_tcp_fallback=False)."
)


def _lend(region: Region, owner: str, inbox: Handle | None = None) -> Handle:
    """Register ``region`` and lend it through every plane (each says what a peer needs
    to reach it): the handle that reaches it."""
    buffer_id, cell = registry.register(region)
    try:
        planes = bulk_planes().lend(buffer_id, region.address, region.size)
    except BaseException:
        registry.drop(buffer_id)
        raise
    return Handle(
        buffer_id=buffer_id,
        size=region.size,
        writable=region.writable,
        owner=owner,
        proc=local_process().runtime.address,
        pid=os.getpid(),
        token=registry.token,
        identity=registry.identity_address,
        cell=cell,
        address=region.address,
        gate=registry.gate.fd,
        planes=planes,
        inbox=inbox,
    )


def lend_staged(tensor: Any) -> Handle:
    """Register a tensor through two host copies (``_staging``: a GPU's; a CPU tensor
    here only in the tests that check the staging without a GPU)."""
    device, region, inbox = staging.host_copies(tensor)
    if region.size == 0:
        raise ValueError("Cannot create RDMABuffer with size 0.")
    owner = context().actor_instance.actor_id
    writers = _lend(inbox, owner)
    try:
        handle = _lend(region, owner, writers)
    except BaseException:
        registry.drop(writers.buffer_id)
        raise
    staging.add(handle.buffer_id, device, region, inbox, writers.buffer_id)
    return handle


class RDMABuffer:
    """Memory registered for one-sided reads and writes by other processes.

    ``data`` is a 1-D contiguous CPU or CUDA tensor (``tensor.view(torch.uint8).flatten()``
    for any other shape) or a contiguous buffer (memoryview, bytearray). Registering copies
    nothing: readers and writers reach this very memory until ``drop()`` (a GPU's through
    host copies the owner makes at each transfer: ``_staging``); until then the buffer
    keeps ``data`` alive. The object is a small handle: pickle it, send it to any
    actor or the client, and call its methods there.
    """

    __slots__ = ("_handle",)

    def __init__(self, data: LocalMemory) -> None:
        backend = get_rdma_backend()
        if backend == "none":
            raise RuntimeError(
                "Tried to create an RDMABuffer, but RDMA is not available on this "
                "platform. To enable TCP fallback transport, call "
                "monarch.configure(rdma_allow_tcp_fallback=True) before creating "
                "buffers."
            )
        if backend == "tcp":
            warnings.warn(FALLBACK, RDMATcpFallbackWarning, stacklevel=2)
        if is_gpu_tensor(data):
            self._handle = lend_staged(data)
            return
        region = region_of(data)
        if region.size == 0:
            raise ValueError("Cannot create RDMABuffer with size 0.")
        self._handle = _lend(region, context().actor_instance.actor_id)

    @classmethod
    def _of(cls, handle: Handle) -> RDMABuffer:
        buffer: RDMABuffer = object.__new__(cls)
        buffer._handle = handle
        return buffer

    def __reduce__(self) -> tuple[Any, ...]:
        return (RDMABuffer._of, (self._handle,))

    @property
    def backend(self) -> str:
        """The RDMA backend in use (``get_rdma_backend()``, as upstream)."""
        return get_rdma_backend()

    @property
    def owner(self) -> str:
        """The id of the actor (or client) that registered the buffer."""
        return self._handle.owner

    def size(self) -> int:
        """The buffer's size in bytes."""
        return self._handle.size

    def read_into(self, dst: LocalMemory, *, timeout: int = 60) -> Future[None]:
        """Copy the whole buffer into the start of ``dst`` (1-D contiguous, at least
        ``size()`` bytes: ValueError otherwise, raised here)."""
        done = transfer.submit([transfer.read_op(dst, self._handle)], timeout)
        timed("rdma", f"rdma read {self.size()} bytes from {self.owner}", done)  # telemetry
        return done

    def write_from(self, src: LocalMemory, *, timeout: int = 60) -> Future[None]:
        """Copy all of ``src`` (at most ``size()`` bytes: ValueError otherwise) to the
        start of the buffer."""
        done = transfer.submit([transfer.write_op(self._handle, src)], timeout)
        timed("rdma", f"rdma write {self.size()} bytes to {self.owner}", done)  # telemetry
        return done

    def drop(self) -> Future[None]:
        """Unregister the buffer at its owner: later reads and writes, from anyone, fail
        with ``RDMABufferDropped``; the owner's memory is no longer kept alive by it."""
        handle = self._handle
        return transfer.submit_call(lambda deadline: transfer.drop(handle, deadline), 60)

    def __repr__(self) -> str:
        h = self._handle
        return f"<RDMABuffer {h.size} bytes of {h.owner}>"
