"""Interfaces a transport plug-in implements (entry-point group ``monarch.transports``)."""

from ._abc import (
    Connection,
    ConnectionAttribute,
    ConnectionHandler,
    FrameQueue,
    Listener,
    PushReceiver,
    Transport,
)
from ._socket import SocketConnection
from ._socket_io import SocketIO
from ._socket_transport import SocketListener, SocketTransport

__all__ = [
    "Connection",
    "ConnectionAttribute",
    "ConnectionHandler",
    "FrameQueue",
    "Listener",
    "PushReceiver",
    "SocketConnection",
    "SocketIO",
    "SocketListener",
    "SocketTransport",
    "Transport",
]
