"""What an ``RDMABuffer`` carries when it travels: where the buffer is and how to reach it."""

from __future__ import annotations

from dataclasses import dataclass


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
    tcp_host: str
    tcp_port: int
    """The owner's TCP data server (see ``_tcp``)."""
    rkey: int = 0
    """The buffer's memory region key at the owner's ibverbs device (0: not registered)."""
