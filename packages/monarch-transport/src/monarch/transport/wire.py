"""The wire schema (msgspec Structs) and the framing codec, for peers and plug-ins."""

from ._framing import FrameDecoder, encode_frame, encode_frame_into
from ._handshake import Handshake
from ._wire import (
    MAGIC,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    Accept,
    ClientHello,
    Envelope,
    HandshakeMessage,
    Proof,
    Reject,
    ServerHello,
    decode_envelope,
    decode_handshake,
    encode,
)

__all__ = [
    "MAGIC",
    "MIN_PROTOCOL_VERSION",
    "PROTOCOL_VERSION",
    "Accept",
    "ClientHello",
    "Envelope",
    "FrameDecoder",
    "Handshake",
    "HandshakeMessage",
    "Proof",
    "Reject",
    "ServerHello",
    "decode_envelope",
    "decode_handshake",
    "encode",
    "encode_frame",
    "encode_frame_into",
]
