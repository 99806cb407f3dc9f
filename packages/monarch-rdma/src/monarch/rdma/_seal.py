"""What keeps the TCP plane's bytes honest: every request and answer carries a tag.

The handshake proves both ends hold the job's secret, but a machine on the path could
still rewrite a request once it is made (write elsewhere, into another buffer) or the
bytes it carries. So each direction of a connection has its own key, derived from the
secret and both handshake nonces, and counts its messages; a message's tag covers its
number, its header and, for its bytes, their Poly1305 under a key for that message alone
(the transport's construction, ``monarch.transport._mac``)::

    tag_n   = BLAKE2b-128[key, person "monarch-rdma-tag"](le64(n) | header | P_n)
    P_n     = Poly1305[r_n](bytes), r_n = BLAKE2b-256[key, person "monarch-rdma-p13"](le64(n))
              (empty when there are no bytes)

A request's header is checked before the owner acts on it; bytes are moved where they go
without a copy and checked as they lie: a write whose bytes were altered is reported to
the writer (and the connection dropped), a read's to the reader, as a transfer error.
Replayed, dropped or reordered messages fail like forged ones (the numbers are never sent).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Final

from cryptography.hazmat.primitives.poly1305 import Poly1305

TAG_SIZE: Final = 16
_COUNT: Final = struct.Struct("<Q")


def session_keys(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> tuple[bytes, bytes]:
    """(client-to-server key, server-to-client key) of one connection."""

    def derive(label: bytes) -> bytes:
        message = b"monarch-rdma/1 key " + label + server_nonce + client_nonce
        return hmac.new(secret, message, hashlib.sha256).digest()

    return derive(b"c2s"), derive(b"s2c")


class Seal:
    """One direction of a connection: its key and the number of its next message. Both
    ends keep one per direction, in step."""

    __slots__ = ("count", "key")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.count = 0

    def tag(self, header: bytes, data: memoryview | None = None) -> bytes:
        """The next message's tag (counted)."""
        number = _COUNT.pack(self.count)
        self.count += 1
        outer = hashlib.blake2b(
            number, key=self.key, digest_size=TAG_SIZE, person=b"monarch-rdma-tag"
        )
        outer.update(header)
        if data is not None and data.nbytes:
            one_time = hashlib.blake2b(
                number, key=self.key, digest_size=32, person=b"monarch-rdma-p13"
            ).digest()
            mac = Poly1305(one_time)
            mac.update(data)
            outer.update(mac.finalize())
        return outer.digest()

    def skip(self) -> None:
        """Count a message without checking it (a refused write's bytes, dropped)."""
        self.count += 1

    def check(self, tag: bytes, header: bytes, data: memoryview | None = None) -> bool:
        """Whether ``tag`` is the next message's (counted either way)."""
        return hmac.compare_digest(tag, self.tag(header, data))
