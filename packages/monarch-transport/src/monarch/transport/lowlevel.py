"""The built-in transports as classes, the receive-buffer allocator and a listener's
admission of unauthenticated connections, for the layers that build a data plane of their
own (monarch-rdma's ibverbs transport dials its out-of-band TCP with ``TcpTransport`` and
receives into ``fresh_bytearray``; its TCP data server bounds its handshakes with
``Admission``). Everything else reaches a transport by scheme through the registry
(``get_transport``)."""

from ._admission import Admission, Pending
from ._gateway import GatewayTransport
from ._memory import fresh_bytearray
from ._tcp import TcpTransport
from ._tls import TlsTransport
from ._unix import UnixTransport

__all__ = [
    "Admission",
    "GatewayTransport",
    "Pending",
    "TcpTransport",
    "TlsTransport",
    "UnixTransport",
    "fresh_bytearray",
]
