"""The built-in transports as classes, the receive-buffer allocator, this process's memory
advice and a listener's admission of unauthenticated connections, for the layers that
build on the transports: monarch-rdma's ibverbs transport dials its out-of-band TCP with
``TcpTransport`` and receives into ``fresh_bytearray``; its TCP data server bounds its
handshakes with ``Admission`` and proves the job's secret with the transports' sans-I/O
``Handshake``, whose ``FrameKeys`` key its messages; the core's payloads and its
zygote's heap take huge pages through ``advise_huge_pages`` and
``collapse_to_huge_pages`` (one binding of ``madvise`` for every layer). Everything else
reaches a transport by scheme through the registry (``get_transport``)."""

from ._admission import Admission, Pending
from ._gateway import GatewayTransport
from ._handshake import FrameKeys, Handshake
from ._memory import (
    HUGE_PAGE,
    advise_huge_pages,
    collapse_to_huge_pages,
    fresh_bytearray,
    whole_huge_pages,
)
from ._tcp import TcpTransport
from ._tls import TlsTransport
from ._unix import UnixTransport

__all__ = [
    "HUGE_PAGE",
    "Admission",
    "FrameKeys",
    "GatewayTransport",
    "Handshake",
    "Pending",
    "TcpTransport",
    "TlsTransport",
    "UnixTransport",
    "advise_huge_pages",
    "collapse_to_huge_pages",
    "fresh_bytearray",
    "whole_huge_pages",
]
