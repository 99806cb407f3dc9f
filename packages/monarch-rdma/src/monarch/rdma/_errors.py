"""The warnings upstream's ``monarch.rdma`` defines, and the errors a transfer ends with.

Upstream leaves a dead owner, a dropped buffer or a cut connection to whatever its Rust
layer reports; here each is an exception of its own under ``RDMAError``, raised by the
operation's Future, so a caller can tell "try another owner" from "you dropped it".
"""

from __future__ import annotations

import warnings

from monarch.core import MonarchError


class RDMAReadTransferWarning(Warning):
    """Upstream's warning for a read that takes a slow path (kept for its name)."""


class RDMAWriteTransferWarning(Warning):
    """Upstream's warning for a write that takes a slow path (kept for its name)."""


class RDMATcpFallbackWarning(Warning):
    """No ibverbs device: buffers move over shared memory within a host, TCP between hosts."""


# As upstream: each is shown once per process, not once per buffer.
warnings.simplefilter("once", RDMAReadTransferWarning)
warnings.simplefilter("once", RDMAWriteTransferWarning)
warnings.simplefilter("once", RDMATcpFallbackWarning)


class RDMAError(MonarchError, RuntimeError):
    """A transfer, drop or atomic on an ``RDMABuffer`` failed."""


class RDMABufferDropped(RDMAError):
    """The buffer was dropped (by its owner or a holder of a handle) before the operation."""


class RDMATransferError(RDMAError):
    """The transfer was cut by a fault (a lost connection, an unreadable process)."""


class RDMAOwnerDied(RDMATransferError):
    """The process that owns the buffer is gone: its memory went with it."""


class RDMATimeoutError(RDMAError, TimeoutError):
    """The operation did not end within its ``timeout``; its memory may be half written."""
