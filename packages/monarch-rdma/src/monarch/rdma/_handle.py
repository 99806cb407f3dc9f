"""What an ``RDMABuffer`` carries when it travels: where the buffer is and how to reach it.

A ``Handle`` is a loan of monarch-core's bulk-data wing (``monarch.core.lowlevel.Loan``):
each plane it was lent through says, under its name, what a peer needs to reach it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Handle:
    buffer_id: int
    size: int
    writable: bool
    owner: str
    """The actor (or client) that registered it: upstream's ``RDMABuffer.owner``."""
    proc: str
    """The owner's runtime address: its ``rdma`` service is asked there (writes it
    pulls, drops, atomics, verbs connections) and its death watched."""
    pid: int
    token: int
    """The owner process's token (see ``_registry``)."""
    identity: int
    """Address of the owner's identity cell."""
    cell: int
    """Address of this buffer's liveness cell in the owner."""
    address: int
    """Where the bytes are in the owner's memory."""
    gate: int = -1
    """The owner's write-gate file (``monarch.core.lowlevel.WriteGate``): a writer of its
    host writes straight into its memory while it holds the buffer's gate (-1: none, the
    owner pulls the bytes)."""
    planes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """What each plane that lent the buffer said a peer needs, by the plane's name (the
    TCP plane: the owner's data server; the ibverbs plane: the region's rkey)."""
    inbox: Handle | None = None
    """For a GPU buffer (``_staging``): the host buffer that writers write, the owner
    staging its bytes to the GPU after each write and from it before each read. This
    handle's own memory is then the host copy that readers read."""

    def reach(self, plane: str) -> tuple[Any, ...] | None:
        """What ``plane`` said a peer needs to reach the buffer (None: it did not lend it)."""
        for name, reach in self.planes:
            if name == plane:
                return reach
        return None
