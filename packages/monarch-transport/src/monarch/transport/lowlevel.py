"""The built-in transports as classes, and the receive-buffer allocator, for the layers that
build a data plane of their own on them (monarch-rdma's ibverbs transport dials its
out-of-band TCP with ``TcpTransport`` and receives into ``fresh_bytearray``). Everything
else reaches a transport by scheme through the registry (``get_transport``)."""

from ._gateway import GatewayTransport
from ._memory import fresh_bytearray
from ._tcp import TcpTransport
from ._tls import TlsTransport
from ._unix import UnixTransport

__all__ = ["GatewayTransport", "TcpTransport", "TlsTransport", "UnixTransport", "fresh_bytearray"]
