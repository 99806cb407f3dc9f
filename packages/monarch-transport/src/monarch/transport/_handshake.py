"""The connection handshake, sans I/O: version agreement, mutual authentication, keys.

Both sides prove knowledge of the shared secret without revealing it, by HMAC-SHA256
challenge-response over the whole transcript, then derive the keys that authenticate
every frame after it (``_mac``)::

    client -> server   MAGIC, ClientHello(min_version, max_version, nonce_c)
    server -> client   ServerHello(version, nonce_s)
    client -> server   Proof(HMAC(secret, "client" | transcript), features offered)
    server -> client   Proof(HMAC(secret, "server" | features | transcript), features agreed)
                       (or Reject(reason) instead of any of these, and the end)

    th  = SHA-256(transcript, both proofs included)
    prk = HMAC-SHA256(th, secret)                                 (HKDF-Extract)
    key = HMAC-SHA256(prk, "monarch-transport <direction> frames" | 0x01)
          for each direction, client->server and server->client   (HKDF-Expand)

Each proof covers every byte sent before it in both directions, nonces from both sides
included, so a proof is good for this one connection only: a relay cannot replay it
elsewhere, and a peer that mutates, replays or reorders any byte fails the next proof.
The keys depend on the whole transcript too: a relay that passes the handshake through
unchanged can neither forge nor replay a frame (it lacks the keys), and one that changed
a byte made the two sides derive different keys.

Who proves first. A proof is an HMAC over the secret, which someone who saw it could
attack offline; with a secret of 128 random bits or more (``MIN_SECRET_SIZE``, enforced)
that search is hopeless, which is the real defence. The order still matters for short
secrets and defence in depth: the listener is the side anyone can reach, so it proves
nothing until the connecting side has proven itself; a client proves first, and only to
the address it chose to dial. An unauthenticated client gets a ServerHello (a version
and a random nonce) and then a Reject: nothing derived from the secret.

Inside TLS the transcript also covers the TLS channel binding (``tls-unique``, the first
Finished message, which each side reads from its own TLS session and never sends), so a
relay that terminates TLS on both sides makes the proofs fail. With TLS 1.3 and such a
binding, TLS records already authenticate every byte between the two peers, and frames
carry no MAC of their own (``frame_keys`` is None).

Each handshake message is framed as ``u16 length | msgpack`` and is at most
``MAX_MESSAGE`` bytes. Protocol 1 (the server proved first, frames had no MAC) is no
longer spoken.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import msgspec

from ._errors import AuthenticationError, HandshakeError, ProtocolVersionError
from ._mac import FrameMac, available_features
from ._wire import (
    FEATURE_POLY1305,
    MAGIC,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    REJECT_AUTH,
    REJECT_MALFORMED,
    REJECT_VERSION,
    ClientHello,
    HandshakeMessage,
    Proof,
    Reject,
    ServerHello,
    decode_handshake,
    encode,
)

MAX_MESSAGE: Final = 1024
NONCE_SIZE: Final = 32
MIN_SECRET_SIZE: Final = 16
"""128 bits: the least secret accepted, so that no offline search of a proof can pay."""
_LEN: Final = struct.Struct(">H")
_SERVER_LABEL: Final = b"monarch-transport server proof\x00"
_CLIENT_LABEL: Final = b"monarch-transport client proof\x00"
_BINDING_LABEL: Final = b"monarch-transport tls-unique\x00"
_KEY_LABELS: Final = {
    "client": b"monarch-transport client->server frames\x01",
    "server": b"monarch-transport server->client frames\x01",
}

Role = Literal["client", "server"]
_M = TypeVar("_M", bound=msgspec.Struct)


def check_secret(secret: bytes) -> bytes:
    """The secret as bytes, or a clear error when it is not bytes or too short."""
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"the shared secret must be bytes, not {type(secret).__name__}")
    if len(secret) < MIN_SECRET_SIZE:
        raise ValueError(
            f"the shared secret must be at least {MIN_SECRET_SIZE} bytes (128 bits) of "
            f"random data, not {len(secret)} bytes (e.g. secrets.token_bytes(32))"
        )
    return bytes(secret)


@dataclass(frozen=True, slots=True)
class FrameKeys:
    """The session keys of one side (for the frames it sends and those it receives) and
    the optional features agreed (``FEATURE_*`` bits)."""

    send: bytes
    receive: bytes
    features: int = 0

    def macs(self) -> tuple[FrameMac, FrameMac]:
        """Fresh MAC states (seal 0) for sending and receiving."""
        poly1305 = bool(self.features & FEATURE_POLY1305)
        return FrameMac(self.send, poly1305=poly1305), FrameMac(self.receive, poly1305=poly1305)

    def __repr__(self) -> str:  # keys stay out of logs and tracebacks
        return "FrameKeys(...)"


class Handshake:
    """One side of the handshake. Feed it bytes; send what it produces.

    ``receive_data`` raises :class:`HandshakeError` on any failure; a Reject for the
    peer may then still be waiting in :meth:`data_to_send` (send it best-effort).
    ``channel_binding``: the TLS session's ``tls-unique`` when the connection runs in
    TLS 1.3 (both sides must pass their own); frames then need no MAC of their own.
    ``features``: the optional ``FEATURE_*`` this side can use (default: what this
    process has); the client offers them, the server picks those it has too.
    """

    def __init__(
        self,
        role: Role,
        secret: bytes,
        *,
        min_version: int = MIN_PROTOCOL_VERSION,
        max_version: int = PROTOCOL_VERSION,
        nonce: bytes | None = None,
        channel_binding: bytes | None = None,
        features: int | None = None,
    ) -> None:
        if role not in ("client", "server"):
            raise ValueError(f"role must be 'client' or 'server', not {role!r}")
        if not MIN_PROTOCOL_VERSION <= min_version <= max_version:
            raise ValueError(
                f"bad version range {min_version}..{max_version}"
                f" (the oldest spoken is {MIN_PROTOCOL_VERSION})"
            )
        self.role: Role = role
        self._secret = check_secret(secret)
        self._min, self._max = min_version, max_version
        self._nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        self._transcript = bytearray()
        if channel_binding is not None:
            self._transcript += _BINDING_LABEL + _LEN.pack(len(channel_binding))
            self._transcript += channel_binding
        self._bound = channel_binding is not None
        self._features = available_features() if features is None else features
        self.features = 0
        """Once complete: the optional features both sides use."""
        self._inbox = bytearray()
        self._outbox = bytearray()
        self._step = 0
        self._last_raw = b""
        self._failed: HandshakeError | None = None
        self.version: int | None = None
        """The agreed protocol version, once the handshake is complete."""
        self.complete = False
        self.frame_keys: FrameKeys | None = None
        """Once complete: the keys of this side's frames, or None when the connection
        is bound to a TLS 1.3 channel (TLS authenticates the frames)."""
        if role == "client":
            self._transcript += MAGIC
            self._outbox += MAGIC
            self._send(ClientHello(min_version, max_version, self._nonce))
        else:
            self._step = -1  # waiting for MAGIC

    # -- interface ------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        out = bytes(self._outbox)
        self._outbox.clear()
        return out

    def receive_data(self, data: bytes) -> None:
        if self._failed is not None:
            raise self._failed
        self._inbox += data
        if self.complete:
            return
        try:
            self._advance()
        except HandshakeError as exc:
            self._failed = exc
            raise

    @property
    def leftover(self) -> bytes:
        """Bytes received after the handshake completed: the start of the frame stream."""
        return bytes(self._inbox) if self.complete else b""

    @property
    def wants_more(self) -> bool:
        return not self.complete and self._failed is None

    # -- state machine --------------------------------------------------------------

    def _advance(self) -> None:
        while not self.complete:
            if self._step == -1:
                if len(self._inbox) < len(MAGIC):
                    if not MAGIC.startswith(bytes(self._inbox)):
                        raise HandshakeError("not a monarch peer (bad magic bytes)")
                    return
                if bytes(self._inbox[: len(MAGIC)]) != MAGIC:
                    raise HandshakeError("not a monarch peer (bad magic bytes)")
                del self._inbox[: len(MAGIC)]
                self._transcript += MAGIC
                self._step = 0
                continue
            message = self._take()
            if message is None:
                return
            if isinstance(message, Reject):
                raise _rejection(message)
            if self.role == "server":
                self._server_step(message)
            else:
                self._client_step(message)

    def _server_step(self, message: HandshakeMessage) -> None:
        if self._step == 0:
            hello = self._expect(message, ClientHello)
            version = min(hello.max_version, self._max)
            if version < max(hello.min_version, self._min) or len(hello.nonce) != NONCE_SIZE:
                reason = (
                    f"no common protocol version: client speaks {hello.min_version}.."
                    f"{hello.max_version}, server {self._min}..{self._max}"
                )
                self._send(Reject(reason, REJECT_VERSION))
                raise ProtocolVersionError(reason)
            self.version = version
            self._send(ServerHello(version, self._nonce))
            self._step = 1
        else:
            proof = self._expect(message, Proof, record=False)
            if not hmac.compare_digest(proof.mac, self._mac(_CLIENT_LABEL)):
                self._send(Reject("authentication failed", REJECT_AUTH))
                raise AuthenticationError("client failed to prove the shared secret")
            self._transcript += self._last_raw
            self.features = proof.features & self._features
            self._send(Proof(self._mac(_SERVER_LABEL, self.features), self.features))
            self._finish()

    def _client_step(self, message: HandshakeMessage) -> None:
        if self._step == 0:
            hello = self._expect(message, ServerHello)
            if not self._min <= hello.version <= self._max or len(hello.nonce) != NONCE_SIZE:
                reason = (
                    f"server chose protocol version {hello.version},"
                    f" outside {self._min}..{self._max}"
                )
                self._send(Reject(reason, REJECT_VERSION))
                raise ProtocolVersionError(reason)
            self.version = hello.version
            self._send(Proof(self._mac(_CLIENT_LABEL), self._features))
            self._step = 1
        else:
            proof = self._expect(message, Proof, record=False)
            if proof.features & ~self._features:
                raise HandshakeError(f"server chose features {proof.features:#x} not offered")
            if not hmac.compare_digest(proof.mac, self._mac(_SERVER_LABEL, proof.features)):
                # No Reject: the server is done and reads frames now; closing tells it.
                raise AuthenticationError(
                    "secret mismatch: the server's proof does not match our secret"
                )
            self._transcript += self._last_raw
            self.features = proof.features
            self._finish()

    def _finish(self) -> None:
        """Derive this side's frame keys from the secret and the whole transcript."""
        self.complete = True
        if self._bound:
            return
        th = hashlib.sha256(self._transcript).digest()
        prk = hmac.digest(th, self._secret, "sha256")
        client, server = (hmac.digest(prk, _KEY_LABELS[r], "sha256") for r in ("client", "server"))
        self.frame_keys = (
            FrameKeys(send=client, receive=server, features=self.features)
            if self.role == "client"
            else FrameKeys(send=server, receive=client, features=self.features)
        )

    # -- helpers ------------------------------------------------------------------

    def _send(self, message: msgspec.Struct) -> None:
        body = encode(message)
        framed = _LEN.pack(len(body)) + body
        self._outbox += framed
        self._transcript += framed

    def _take(self) -> HandshakeMessage | None:
        if len(self._inbox) < 2:
            return None
        (size,) = _LEN.unpack_from(self._inbox)
        if size > MAX_MESSAGE:
            raise HandshakeError(f"handshake message of {size} bytes is too large")
        if len(self._inbox) < 2 + size:
            return None
        raw = bytes(self._inbox[: 2 + size])
        del self._inbox[: 2 + size]
        try:
            message = decode_handshake(raw[2:])
        except msgspec.DecodeError as exc:
            self._send(Reject("malformed handshake message", REJECT_MALFORMED))
            raise HandshakeError(f"malformed handshake message: {exc}") from None
        self._last_raw = raw
        return message

    def _expect(self, message: HandshakeMessage, kind: type[_M], *, record: bool = True) -> _M:
        if not isinstance(message, kind):
            raise HandshakeError(
                f"unexpected handshake message {type(message).__name__}, wanted {kind.__name__}"
            )
        if record:
            self._transcript += self._last_raw
        return message

    def _mac(self, label: bytes, features: int | None = None) -> bytes:
        """The proof: over the transcript, and for the server the features it agreed (they
        follow the proof in its message, so a flipped bit there fails the proof itself)."""
        agreed = b"" if features is None else features.to_bytes(8, "big")
        return hmac.digest(self._secret, label + agreed + self._transcript, "sha256")


def _rejection(reject: Reject) -> HandshakeError:
    reason = f"peer rejected the handshake: {reject.reason}"
    if reject.code == REJECT_AUTH:
        return AuthenticationError(f"{reason} (our secret is not the listener's)")
    if reject.code == REJECT_VERSION:
        return ProtocolVersionError(reason)
    return HandshakeError(reason)
