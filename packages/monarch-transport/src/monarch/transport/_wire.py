"""Wire schema: msgspec Structs for the connection handshake and the gateway.

What travels inside frames after the handshake (monarch-core's envelope, hello and
heartbeats) is the layer above's own schema, not the transport's.

Every Struct is ``array_like`` (encoded as a msgpack array, no field names on the
wire) and carries an integer ``tag`` as its first element, so a decoder can tell
the message kind from one byte. Structs are ``gc=False``: they hold only strings,
numbers and other such Structs, so they can never be part of a reference cycle, and
a busy receiver decoding thousands a second does not feed the cyclic collector.

Versioning rules (the reason these Structs look the way they do):

1. ``PROTOCOL_VERSION`` is negotiated by the handshake: each side offers an
   inclusive range and the highest common version wins; no common version means the
   connection is refused with :class:`~monarch.transport.ProtocolVersionError`.
2. Within one protocol version a Struct only ever grows at its end, and every field
   added later has a default, so an older decoder (which ignores trailing array
   items) and a newer decoder (which fills defaults) both read every message.
3. Fields are never removed, reordered or retyped, and a tag is never reused. A
   change that cannot follow rule 2 bumps ``PROTOCOL_VERSION`` and keeps decoding
   the old layout for as long as ``MIN_PROTOCOL_VERSION`` admits it.
4. The handshake layout (``MAGIC``, ``ClientHello``) is frozen forever: it is what
   lets two different versions find out that they differ.
"""

from __future__ import annotations

from typing import Final

import msgspec

PROTOCOL_VERSION: Final = 2
"""The newest protocol version this package speaks.

2: the client proves first, the handshake derives per-direction keys, and every frame
after it carries a MAC (``_handshake``, ``_mac``, ``_framing``). 1: the server proved
first and frames had no MAC; no longer spoken, as it let a relay inject frames."""
MIN_PROTOCOL_VERSION: Final = 2
"""The oldest protocol version this package still speaks."""

MAGIC: Final = b"\x89monarch"
"""First eight bytes a client sends: tells a monarch peer from anything else."""


class ClientHello(msgspec.Struct, array_like=True, tag=1, frozen=True, gc=False):
    """Client -> server: versions spoken and a fresh nonce."""

    min_version: int
    max_version: int
    nonce: bytes


class ServerHello(msgspec.Struct, array_like=True, tag=2, frozen=True, gc=False):
    """Server -> client: the chosen version and the server's fresh nonce."""

    version: int
    nonce: bytes


class Proof(msgspec.Struct, array_like=True, tag=3, frozen=True, gc=False):
    """HMAC-SHA256 under the shared secret of every handshake byte sent before it.

    The client sends its proof first; the server's proof, after it, ends the handshake.
    """

    mac: bytes
    features: int = 0
    """Client: the optional features it can use (``FEATURE_*`` bits); server: those of them
    both will use. The server's choice is covered by the keys, the client's offer by the
    server's proof."""


class Accept(msgspec.Struct, array_like=True, tag=4, frozen=True, gc=False):
    """Protocol 1 only (server -> client: handshake complete). Kept so that its tag is
    never reused; protocol 2 ends with the server's Proof instead."""


class Reject(msgspec.Struct, array_like=True, tag=5, frozen=True, gc=False):
    """Either side: the handshake failed, with the reason; the connection closes."""

    reason: str
    code: int = 0


HandshakeMessage = ClientHello | ServerHello | Proof | Accept | Reject

FEATURE_POLY1305: Final = 1
"""Large frame parts are MACed by a one-time GMAC rather than SHA-256 (``_mac``; the name is
the MAC it first meant, Poly1305); needs the
optional ``cryptography`` on both sides."""

REJECT_AUTH: Final = 1
REJECT_VERSION: Final = 2
REJECT_MALFORMED: Final = 3


GATEWAY_GREETING: Final = b"\x89monarch-gateway/1\n"
"""First bytes a gateway sends on every connection, before its nonce (``_gateway``)."""


class GatewayOpen(msgspec.Struct, array_like=True, tag=48, frozen=True, gc=False):
    """To a gateway: connect me to ``target`` (a ``tcp://``/``tls://`` address) and splice."""

    target: str


class GatewayRegister(msgspec.Struct, array_like=True, tag=49, frozen=True, gc=False):
    """To a gateway: make me reachable through you; this connection carries the
    ``GatewayIncoming`` notices."""


class GatewayReach(msgspec.Struct, array_like=True, tag=50, frozen=True, gc=False):
    """To a gateway: connect me to the registered client ``route`` and splice."""

    route: str


class GatewayAccept(msgspec.Struct, array_like=True, tag=51, frozen=True, gc=False):
    """To a gateway, from a registered client: this connection is the one ``token`` waits for."""

    token: str


class GatewayGranted(msgspec.Struct, array_like=True, tag=52, frozen=True, gc=False):
    """From a gateway: done (``route``: a registration's); raw bytes follow, except on a
    registration's connection."""

    route: str = ""


class GatewayRefused(msgspec.Struct, array_like=True, tag=53, frozen=True, gc=False):
    """From a gateway: the request failed, with the reason; the connection closes."""

    reason: str


class GatewayIncoming(msgspec.Struct, array_like=True, tag=54, frozen=True, gc=False):
    """From a gateway to a registered client: a peer waits; answer with ``GatewayAccept``."""

    token: str


GatewayRequest = GatewayOpen | GatewayRegister | GatewayReach | GatewayAccept
GatewayReply = GatewayGranted | GatewayRefused | GatewayIncoming

_handshake_decoder: Final = msgspec.msgpack.Decoder(HandshakeMessage)
_gateway_request_decoder: Final = msgspec.msgpack.Decoder(GatewayRequest)
_gateway_reply_decoder: Final = msgspec.msgpack.Decoder(GatewayReply)
_encoder: Final = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> bytes:
    """Encode a handshake or gateway Struct (any msgspec Struct) to msgpack."""
    return _encoder.encode(message)


def decode_handshake(data: bytes | memoryview) -> HandshakeMessage:
    """Decode one handshake message; raises ``msgspec.DecodeError`` on garbage."""
    message: HandshakeMessage = _handshake_decoder.decode(data)
    return message


def decode_gateway_request(data: bytes | memoryview) -> GatewayRequest:
    """Decode a request to a gateway; raises ``msgspec.DecodeError`` on garbage."""
    request: GatewayRequest = _gateway_request_decoder.decode(data)
    return request


def decode_gateway_reply(data: bytes | memoryview) -> GatewayReply:
    """Decode what a gateway sends; raises ``msgspec.DecodeError`` on garbage."""
    reply: GatewayReply = _gateway_reply_decoder.decode(data)
    return reply
