"""monarch.transport: authenticated multipart-frame connections over unix, tcp and tls.

The bottom layer of Monarch: it moves length-prefixed multipart frames between
addresses (``unix:///path``, ``unix://@name``, ``tcp://host:port``, ``tls://host:port``,
``gateway://host:port`` through a gateway that splices connections for a client outside
its peers' network),
after a handshake that agrees on a protocol version and proves both ends know the
job's secret; every frame after it carries a MAC under keys the handshake derived.
Transports are plug-ins under the ``monarch.transports`` entry points.
"""

from ._abc import (
    Connection,
    ConnectionAttribute,
    ConnectionHandler,
    FrameQueue,
    Listener,
    PushReceiver,
    Transport,
    TransportOptions,
)
from ._address import Address
from ._errors import (
    AddressError,
    AuthenticationError,
    ConnectError,
    ConnectionClosed,
    FrameAuthenticationError,
    FrameTooLarge,
    HandshakeError,
    ProtocolError,
    ProtocolVersionError,
    TransportError,
    UnknownTransportError,
)
from ._framing import DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_PARTS, Buffer, Frame
from ._gateway import Gateway, open_gateway
from ._handshake import MIN_SECRET_SIZE
from ._plugins import MissingPlugin, PluginConflict, PluginGroup, load_plugin, plugin_group
from ._registry import (
    ENTRY_POINT_GROUP,
    available_transports,
    get_transport,
    open_connection,
    open_listener,
    register_transport,
)

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_PARTS",
    "ENTRY_POINT_GROUP",
    "MIN_SECRET_SIZE",
    "Address",
    "AddressError",
    "AuthenticationError",
    "Buffer",
    "ConnectError",
    "Connection",
    "ConnectionAttribute",
    "ConnectionClosed",
    "ConnectionHandler",
    "Frame",
    "FrameAuthenticationError",
    "FrameQueue",
    "FrameTooLarge",
    "Gateway",
    "HandshakeError",
    "Listener",
    "MissingPlugin",
    "PluginConflict",
    "PluginGroup",
    "ProtocolError",
    "ProtocolVersionError",
    "PushReceiver",
    "Transport",
    "TransportError",
    "TransportOptions",
    "UnknownTransportError",
    "available_transports",
    "get_transport",
    "load_plugin",
    "open_connection",
    "open_gateway",
    "open_listener",
    "plugin_group",
    "register_transport",
]
