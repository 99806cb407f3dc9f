"""The wire schema (msgspec Structs), the handshake, the framing codec and the frame MAC,
sans I/O, for peers and plug-ins."""

from ._framing import FrameDecoder, encode_frame, encode_frame_into, seal_into
from ._handshake import MIN_SECRET_SIZE, FrameKeys, Handshake
from ._mac import TAG_SIZE, FrameMac
from ._wire import (
    FEATURE_POLY1305,
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
    "FEATURE_POLY1305",
    "MAGIC",
    "MIN_PROTOCOL_VERSION",
    "MIN_SECRET_SIZE",
    "PROTOCOL_VERSION",
    "TAG_SIZE",
    "Accept",
    "ClientHello",
    "Envelope",
    "FrameDecoder",
    "FrameKeys",
    "FrameMac",
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
    "seal_into",
]
