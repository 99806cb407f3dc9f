"""The built-in transports as classes, the receive-buffer allocator and a listener's admission
of unauthenticated connections, for the layers that build a data plane of their own
(monarch-rdma's ibverbs transport dials its out-of-band TCP with ``TcpTransport`` and
receives into ``fresh_bytearray``; its TCP data server bounds its handshakes with
``Admission`` and proves the job's secret with the transports' sans-I/O ``Handshake``,
whose ``FrameKeys`` key its messages). Everything else reaches a transport by scheme
through the registry (``get_transport``)."""

from ._admission import Admission, Pending
from ._gateway import GatewayTransport
from ._handshake import FrameKeys, Handshake
from ._memory import fresh_bytearray
from ._tcp import TcpTransport
from ._tls import TlsTransport
from ._unix import UnixTransport

__all__ = [
    "Admission",
    "FrameKeys",
    "GatewayTransport",
    "Handshake",
    "Pending",
    "TcpTransport",
    "TlsTransport",
    "UnixTransport",
    "fresh_bytearray",
]
