"""The connection handshake, sans I/O: version agreement and mutual authentication.

Both sides prove knowledge of the shared secret without revealing it, by HMAC
challenge-response over the whole transcript::

    client -> server   MAGIC, ClientHello(min_version, max_version, nonce_c)
    server -> client   ServerHello(version, nonce_s), Proof(HMAC(secret, "server" | transcript))
    client -> server   Proof(HMAC(secret, "client" | transcript))
    server -> client   Accept                      (or Reject(reason) at any step)

Each proof covers every byte sent before it in both directions, so a peer that
mutates, replays or reorders any byte fails the next proof. The server proves
itself first, so a client never hands its proof to an impostor. Each handshake
message is framed as ``u16 length | msgpack`` and is at most ``MAX_MESSAGE`` bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from typing import Final, Literal, TypeVar

import msgspec

from ._errors import AuthenticationError, HandshakeError, ProtocolVersionError
from ._wire import (
    MAGIC,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    REJECT_AUTH,
    REJECT_MALFORMED,
    REJECT_VERSION,
    Accept,
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
_LEN: Final = struct.Struct(">H")
_SERVER_LABEL: Final = b"monarch-transport server proof\x00"
_CLIENT_LABEL: Final = b"monarch-transport client proof\x00"

Role = Literal["client", "server"]
_M = TypeVar("_M", bound=msgspec.Struct)


def check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"the shared secret must be bytes, not {type(secret).__name__}")
    if not secret:
        raise ValueError("the shared secret must not be empty")
    return bytes(secret)


class Handshake:
    """One side of the handshake. Feed it bytes; send what it produces.

    ``receive_data`` raises :class:`HandshakeError` on any failure; a Reject for the
    peer may then still be waiting in :meth:`data_to_send` (send it best-effort).
    """

    def __init__(
        self,
        role: Role,
        secret: bytes,
        *,
        min_version: int = MIN_PROTOCOL_VERSION,
        max_version: int = PROTOCOL_VERSION,
        nonce: bytes | None = None,
    ) -> None:
        if role not in ("client", "server"):
            raise ValueError(f"role must be 'client' or 'server', not {role!r}")
        if not 0 < min_version <= max_version:
            raise ValueError(f"bad version range {min_version}..{max_version}")
        self.role: Role = role
        self._secret = check_secret(secret)
        self._min, self._max = min_version, max_version
        self._nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        self._transcript = bytearray()
        self._inbox = bytearray()
        self._outbox = bytearray()
        self._step = 0
        self._failed: HandshakeError | None = None
        self.version: int | None = None
        """The agreed protocol version, once the handshake is complete."""
        self.complete = False
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
        if self.complete:
            self._inbox += data
            return
        self._inbox += data
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
            self._send(Proof(self._mac(_SERVER_LABEL)))
            self._step = 1
        else:
            proof = self._expect(message, Proof, record=False)
            expected = self._mac(_CLIENT_LABEL)
            if not hmac.compare_digest(proof.mac, expected):
                self._send(Reject("authentication failed", REJECT_AUTH))
                raise AuthenticationError("client failed to prove the shared secret")
            self._send(Accept())
            self.complete = True

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
            self._step = 1
        elif self._step == 1:
            proof = self._expect(message, Proof, record=False)
            if not hmac.compare_digest(proof.mac, self._mac(_SERVER_LABEL)):
                self._send(Reject("authentication failed", REJECT_AUTH))
                raise AuthenticationError(
                    "secret mismatch: the server's proof does not match our secret"
                )
            self._transcript += self._last_raw
            self._send(Proof(self._mac(_CLIENT_LABEL)))
            self._step = 2
        else:
            self._expect(message, Accept)
            self.complete = True

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

    def _mac(self, label: bytes) -> bytes:
        return hmac.new(self._secret, label + self._transcript, hashlib.sha256).digest()


def _rejection(reject: Reject) -> HandshakeError:
    reason = f"peer rejected the handshake: {reject.reason}"
    if reject.code == REJECT_AUTH:
        return AuthenticationError(reason)
    if reject.code == REJECT_VERSION:
        return ProtocolVersionError(reason)
    return HandshakeError(reason)
