"""What keeps the TCP plane's bytes honest: every request and answer carries a tag.

The handshake proves both ends hold the job's secret, but a machine on the path could
still rewrite a request once it is made (write elsewhere, into another buffer) or the
bytes it carries. So each direction of a connection has its own key, the one the
transports' handshake derived for it from the secret and the whole transcript
(``monarch.transport.lowlevel.Handshake``), and counts its messages; a message's tag is
the transport's own frame seal (``monarch.transport.wire.FrameMac``) over a run of one
message: its number, its header and, for its bytes, their GMAC under a key for that
message alone::

    tag_n   = BLAKE2b-128[key](le64(n) | header | P_n)
    P_n     = GMAC[r_n](bytes)                  (empty when there are no bytes)
    r_n     = BLAKE2b-256[key, person "monarch-poly1305"](le64(n) | le64(0))

A request's header is checked before the owner acts on it; bytes are moved where they go
without a copy and checked as they lie: a write whose bytes were altered is reported to
the writer (and the connection dropped), a read's to the reader, as a transfer error.
Replayed, dropped or reordered messages fail like forged ones (the numbers are never sent).

One seal, the transport's, used the way its receiving side uses it (``absorb``,
``next_part_mac``) on both ends: a sender here hashes its bytes slice by slice while the
kernel sends the slice before (``SLICE``), which keeps the tag off the transfer's critical
path, then takes the tag with ``seal_absorbed``; the transport's sending side hashes a
large part only when the run is sealed, after it was queued, a second pass over the
bytes. The keys are this data connection's own (its handshake's transcript), never a
monarch connection's, so the two uses of the construction never share a key.
"""

from __future__ import annotations

import hmac
from concurrent.futures import Future
from typing import Final

from monarch.core.lowlevel import bulk_executor
from monarch.transport.wire import FrameMac, PartMac

TAG_SIZE: Final = 16


SLICE: Final = 1 << 20
"""Bytes tagged per step while they are sent or received: hashing one slice overlaps the
kernel moving the one before, instead of adding a pass over the whole chunk."""


class Tagger:
    """The tag of one message, fed slice by slice (``covers_data`` False: its header and
    number only, the bytes untagged; see ``rdma_tcp_integrity``)."""

    __slots__ = ("_mac", "_part", "covers_data", "done")

    def __init__(self, mac: FrameMac, header: bytes, covers_data: bool = True) -> None:
        mac.absorb(header)
        self._mac = mac
        self._part: PartMac | None = mac.next_part_mac() if covers_data else None
        self.done = False
        self.covers_data = covers_data

    def update(self, data: memoryview) -> None:
        assert not self.done
        if self._part is not None:
            self._part.update(data)

    def digest(self, has_data: bool) -> bytes:
        """The tag; ``has_data``: the message carries bytes (else no GMAC goes in)."""
        assert not self.done
        self.done = True
        if has_data and self._part is not None:
            self._mac.absorb(self._part.finish())
        return self._mac.seal_absorbed()


class Behind:
    """A message's tagger fed one slice behind its copy, on a bulk thread: the tag of
    slice i runs while the socket copies slice i+1 (a receiver) or slice i itself (a
    sender), instead of after it on the copying thread (GMAC and socket I/O both let go
    of the GIL, so the two overlap on two cores). At most one slice is in flight, so the
    slices are tagged in order; ``wait`` before the digest, and before the copying
    thread leaves (a ``finally``), so no tag outlives its transfer. A slice whose thread
    has not started is taken back and tagged here: never waits behind other bulk work.
    """

    __slots__ = ("_pending", "_tagger")

    def __init__(self, tagger: Tagger) -> None:
        self._tagger = tagger
        self._pending: tuple[Future[None], memoryview] | None = None

    def update(self, piece: memoryview) -> None:
        """Tag ``piece`` after those before it, off this thread."""
        self.wait()
        try:
            future = bulk_executor().submit_urgent(self._tagger.update, piece)
        except RuntimeError:  # the executor is shut down (the process is exiting)
            self._tagger.update(piece)
            return
        self._pending = (future, piece)

    def wait(self) -> None:
        """Until every slice given is tagged (re-raises a tagging error)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        future, piece = pending
        if future.cancel():
            self._tagger.update(piece)
        else:
            future.result()


class Seal:
    """One direction of a connection: its key's seal and the number of its next message
    (``count``). Both ends keep one per direction, in step; one message at a time."""

    __slots__ = ("_mac", "_open", "covers_data")

    def __init__(self, key: bytes, covers_data: bool = True) -> None:
        self._mac = FrameMac(key, poly1305=True)
        self._open: Tagger | None = None
        self.covers_data = covers_data

    @property
    def count(self) -> int:
        return self._mac.seq

    def start(self, header: bytes) -> Tagger:
        """The next message's tagger (counted)."""
        if self._open is not None and not self._open.done:
            self._open.digest(False)  # left unfinished (its transfer failed): counted
        self._open = Tagger(self._mac, header, self.covers_data)
        return self._open

    def tag(self, header: bytes, data: memoryview | None = None) -> bytes:
        """The next message's tag, its bytes (if any) at hand."""
        tagger = self.start(header)
        if data is not None and data.nbytes:
            tagger.update(data)
        return tagger.digest(data is not None and data.nbytes > 0)

    def skip(self) -> None:
        """Count a message without checking it (a refused write's bytes, dropped)."""
        self.start(b"").digest(False)

    def check(self, tag: bytes, header: bytes, data: memoryview | None = None) -> bool:
        """Whether ``tag`` is the next message's (counted either way)."""
        return hmac.compare_digest(tag, self.tag(header, data))
