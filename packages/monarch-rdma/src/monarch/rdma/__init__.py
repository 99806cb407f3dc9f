"""RDMA buffers (upstream's ``monarch.rdma``): one-sided reads and writes of registered memory.

``RDMABuffer(data)`` registers a tensor or buffer without copying it and is a small
picklable handle; whoever holds one ``read_into``/``write_from`` it. ``RDMAAction``
batches them. Without an ibverbs device the bytes go over shared memory within a host
and TCP between hosts (``get_rdma_backend() == "tcp"``), with the same results.
"""

from ._action import RDMAAction
from ._backend import get_rdma_backend, is_ibverbs_available, is_rdma_available
from ._buffer import RDMABuffer
from ._errors import (
    RDMABufferDropped,
    RDMAError,
    RDMAOwnerDied,
    RDMAReadTransferWarning,
    RDMATcpFallbackWarning,
    RDMATimeoutError,
    RDMATransferError,
    RDMAWriteTransferWarning,
)

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMABufferDropped",
    "RDMAError",
    "RDMAOwnerDied",
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMATimeoutError",
    "RDMATransferError",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]
