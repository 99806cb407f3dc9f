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
from ._socket import SocketConnection, SocketIO, SocketListener, SocketTransport

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
