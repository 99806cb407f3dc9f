"""Frame authentication, sans I/O: every frame is sealed under the session key.

The handshake proves that both peers know the secret, but an on-path relay that does not
know it could still let two peers authenticate through it and then write frames of its
own (whose pickles the receiver would run). So every frame after the handshake is
covered by a tag under a key that only the two peers hold: each direction has its own
32-byte key, derived by the handshake from the secret and its whole transcript
(``_handshake``).

Tags are per run, not per frame: the frames a sender queues between two flushes form a
run, and the flush appends a seal that authenticates them all (``_framing``)::

    seal_k = u32 0xFFFFFFFF | BLAKE2b-128[key](le64(k) | E(F_1) | ... | E(F_m))
    E(F)   = header | P(part_0) | ... | P(part_{n-1})
    P(p)   = p                  when the part is at most DIGEST_FROM (16 KiB) bytes
             SHA-256(p)         when it is larger, or, with FEATURE_POLY1305 agreed:
             GMAC[r_k,i](p)     where i counts the run's large parts from 0 and
             r_k,i = BLAKE2b-256[key, person "monarch-poly1305"](le64(k) | le64(i))
             (AES-256-GCM's tag over p as associated data, nothing encrypted)

``F_1 .. F_m`` are the frames after seal ``k-1`` (each side counts seals from 0) and
``header`` a frame's ``u32 n | u64 len_0 ... u64 len_{n-1}`` as sent. The receiver hands
out no frame of a run before its seal checks, and a stream that ends inside a run is
truncated. The seal number is never sent: a replayed, dropped or reordered run fails
like a forged one, and moving a seal changes the runs.

Why runs: a tag costs a keyed-hash call or two (about 1 us in Python) on each side, as
much as the rest of the work for a small frame. A run is hashed where its bytes already
are, in one call per buffer: the sender's coalesced send buffer (which is never shifted
in place, see ``SocketConnection``) and the receiver's read buffer, so a pipelined burst
of small frames costs one tag and a few calls. A frame sent alone (``send``) is its own
run.

Why two hashes: keyed BLAKE2b costs one short call on small data (a copy of a state that
has already absorbed the key), but runs at about 0.5 GB/s, while SHA-256 runs at 1.5
GB/s or more where the CPU has SHA extensions. A large part is therefore hashed by
SHA-256 where it lies (the sender's memory, the receiver's buffer as the bytes arrive)
and only its digest goes into the run; forging it would take a SHA-256 second preimage.
The threshold is the encoder's: parts above it are sent in place, the others copied into
its send buffer. Both hashes are in the standard library: no dependency. Where both
peers have the optional ``cryptography`` (the handshake agrees on ``FEATURE_POLY1305``,
named for the MAC it first meant), large parts go through GMAC instead: a one-time MAC,
under a key derived for that part alone (a fresh ``(k, i)`` each time, so GCM's fixed
nonce is never reused under a key). GHASH runs on the CPU's carry-less multiply: about
25 GB/s here, against Poly1305's ~10 and SHA-256's ~2 (monarch-rdma's TCP plane tags
every byte it moves with this same seal, so its speed is the plane's).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import struct
from functools import cache
from typing import Any, Final

from ._errors import FrameAuthenticationError, TransportError
from ._wire import FEATURE_POLY1305

TAG_SIZE: Final = 16
KEY_SIZE: Final = 32
SEAL_COUNT: Final = 0xFFFF_FFFF
"""The part count that marks a seal instead of a frame."""
SEAL_HEADER: Final = struct.pack("<I", SEAL_COUNT)
SEAL_SIZE: Final = len(SEAL_HEADER) + TAG_SIZE
DIGEST_FROM: Final = 16 * 1024
"""Parts larger than this go into a run as their SHA-256 digest."""

_SEQ: Final = struct.Struct("<Q")
_PART: Final = struct.Struct("<QQ")
_sha256 = hashlib.sha256


@cache
def available_features() -> int:
    """The optional features this process can use (``cryptography`` is imported only
    when a large part first needs it)."""
    return FEATURE_POLY1305 if importlib.util.find_spec("cryptography") else 0


_NONCE: Final = bytes(12)
"""GCM's nonce: fixed, since every part's key is its own."""


@cache
def _gmac() -> Any:
    """A maker of one-time GMACs (an AES-256-GCM encryptor fed associated data only)."""
    try:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError as exc:  # found by find_spec, yet broken
        raise TransportError(f"cryptography cannot be imported for GMAC: {exc}") from exc
    gcm = modes.GCM(_NONCE)
    return lambda key: Cipher(algorithms.AES(key), gcm).encryptor()


class PartMac:
    """The MAC of one large part, fed as it arrives: SHA-256 or a one-time GMAC."""

    __slots__ = ("finish", "update")

    def __init__(self, one_time_key: bytes | None) -> None:
        if one_time_key is None:
            digest = _sha256()
            self.update: Any = digest.update
            self.finish: Any = digest.digest
        else:
            gmac = _gmac()(one_time_key)
            self.update = gmac.authenticate_additional_data

            def finish() -> bytes:
                gmac.finalize()
                tag: bytes = gmac.tag
                return tag

            self.finish = finish


class FrameMac:
    """One direction of a connection: its key, the seal count and the open run.

    The sender notes where each frame's bytes go as it encodes it: :meth:`raw` before
    appending to a send buffer (a bytearray only ever appended to), :meth:`large` for a
    part sent in place; :meth:`seal` then hashes them where they are. The receiver
    :meth:`absorb` s frame bytes in stream order (large parts as their digest) and
    :meth:`check` s each seal. Not thread-safe: frames go in the order they are on the
    wire.
    """

    __slots__ = ("_keyed", "_large_count", "_last", "_part_keys", "_pieces", "_run", "seq")

    def __init__(self, key: bytes, *, poly1305: bool = False) -> None:
        if len(key) != KEY_SIZE:
            raise ValueError(f"a frame key is {KEY_SIZE} bytes, not {len(key)}")
        self._keyed: Any = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
        self._part_keys: Any = (
            hashlib.blake2b(key=key, digest_size=32, person=b"monarch-poly1305")
            if poly1305
            else None
        )
        self._large_count = 0  # receiving: the large parts of the open run so far
        self._run: Any = None  # receiving: the open run's hash
        self._pieces: list[tuple[bytearray, int] | memoryview] = []  # sending: the open run
        self._last: bytearray | None = None  # the send buffer of the last raw piece
        self.seq = 0
        """The number of the next seal."""

    @property
    def open(self) -> bool:
        """Whether frames were noted since the last seal (sending side)."""
        return bool(self._pieces)

    def _open(self) -> Any:
        run = self._run = self._keyed.copy()
        run.update(_SEQ.pack(self.seq))
        return run

    # -- sending -------------------------------------------------------------------

    def raw(self, buffer: bytearray) -> None:
        """Frame bytes are about to be appended to ``buffer``: they belong to the run."""
        if buffer is not self._last:
            self._pieces.append((buffer, len(buffer)))
            self._last = buffer

    def large(self, part: memoryview) -> None:
        """A part larger than DIGEST_FROM, sent from where it is."""
        self._pieces.append(part)
        self._last = None

    def seal(self) -> bytes:
        """The seal closing the open run (which must hold a frame), counted."""
        pieces = self._pieces
        if not pieces:
            raise ValueError("no frame to seal")
        run = self._keyed.copy()
        run.update(_SEQ.pack(self.seq))
        if len(pieces) == 1 and type(pieces[0]) is tuple:  # the usual: one send buffer
            buffer, start = pieces[0]
            run.update(memoryview(buffer)[start:] if start else buffer)
        else:
            large = 0
            for piece in pieces:
                if isinstance(piece, tuple):
                    buffer, start = piece
                    run.update(memoryview(buffer)[start:])
                else:
                    part = self.part_mac(large)
                    part.update(piece)
                    run.update(part.finish())
                    large += 1
        self._pieces = []
        self._last = None
        self.seq += 1
        seal: bytes = SEAL_HEADER + run.digest()
        return seal

    def part_mac(self, index: int) -> PartMac:
        """The MAC of the open run's large part number ``index``."""
        keys = self._part_keys
        if keys is None:
            return PartMac(None)
        keys = keys.copy()
        keys.update(_PART.pack(self.seq, index))
        return PartMac(keys.digest())

    # -- receiving -------------------------------------------------------------------

    def next_part_mac(self) -> PartMac:
        """The MAC of the next large part the receiver reads (absorb what it finishes)."""
        if self._run is None:
            self._open()
        self._large_count += 1
        return self.part_mac(self._large_count - 1)

    def absorb(self, data: Any) -> None:
        """Bytes of the open run as the receiver has them (headers, small parts, the
        digests of large ones)."""
        (self._run if self._run is not None else self._open()).update(data)

    def seal_absorbed(self) -> bytes:
        """The tag of the run absorbed so far (``absorb``, with the digests of its large
        parts from ``next_part_mac``), counted: how a sender that hashes each message as
        it sends it seals it (monarch-rdma's TCP plane, whose bytes are hashed slice by
        slice while the kernel moves the slice before); the peer checks it with ``check``
        or compares it with its own ``seal_absorbed``."""
        run = self._run if self._run is not None else self._open()
        self._run = None
        self._large_count = 0
        self.seq += 1
        tag: bytes = run.digest()
        return tag

    def check(self, tag: Any, last: Any = b"") -> None:
        """Check the seal just read against the open run, with ``last`` bytes of it not
        absorbed yet; raises :class:`FrameAuthenticationError` (the frames of the run must
        then be dropped)."""
        seq = self.seq
        run = self._run
        if run is None:
            run = self._keyed.copy()
            run.update(_SEQ.pack(seq))
        else:
            self._run = None
            self._large_count = 0
        run.update(last)
        self.seq = seq + 1
        if not hmac.compare_digest(run.digest(), tag):
            raise FrameAuthenticationError(
                f"seal {seq} failed authentication: its frames were forged, replayed, "
                "reordered or changed on the way"
            )
