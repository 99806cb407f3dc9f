"""Length-prefixed multipart framing, sans I/O, with frames sealed under a MAC.

A frame is one message made of parts::

    u32 n | u64 len_0 ... u64 len_{n-1} | part_0 ... part_{n-1}      (little endian)

On an authenticated connection the frames come in runs, each closed by a seal that
authenticates it under the sending direction's session key (``_mac``)::

    u32 0xFFFFFFFF | tag (16 bytes)

A sender seals what it queued at each flush. A receiver holds the frames of a run until
their seal checks and hands out none of a run whose seal fails (the connection is then
closed). Without a MAC (TLS 1.3, bound to the handshake, or the codec used alone) there
are no seals.

The encoder never copies a large part: it yields the header (with small parts
coalesced into it) followed by the large parts' own memoryviews, ready for one
vectored write; it hashes the parts where they are. The decoder hands out buffers to
read into (as asyncio's BufferedProtocol does): small frames land many at a time in one
reusable buffer, and a large frame gets one exact-size allocation (not zero-filled: its
pages are touched only by the bytes that fill it) that the socket reads into directly,
so its bytes are copied from the kernel once, and hashed as they arrive.
"""

from __future__ import annotations

import struct
import sys
from collections import deque
from collections.abc import MutableSequence, Sequence
from typing import Final, TypeAlias

from ._errors import FrameTooLarge
from ._mac import DIGEST_FROM, SEAL_COUNT, SEAL_SIZE, FrameMac, PartMac
from ._memory import fresh_bytearray

Buffer: TypeAlias = "bytes | bytearray | memoryview"
Frame: TypeAlias = "list[memoryview]"

DEFAULT_MAX_FRAME_SIZE: Final = 10 * 1024**3
"""Largest frame accepted, summed over its parts (upstream's 10 GiB default)."""
DEFAULT_MAX_PARTS: Final = 65536
"""Most parts in one frame (bounds the header a peer can make us buffer)."""

SPARE_BUFFERS: Final = 2
"""Large receive buffers kept for reuse."""
SPARE_MAX: Final = 64 * 1024 * 1024
"""Larger receive buffers are not kept: an idle connection holds at most this much twice."""
SMALL_PART: Final = DIGEST_FROM
"""Parts up to this size are copied into the header; larger ones are sent in place (and
go into a sealed run as their digest: the MAC hashes each where the encoder puts it)."""

_COUNT: Final = struct.Struct("<I")


def as_bytes_view(part: Buffer) -> memoryview:
    """A flat byte view of any C-contiguous buffer (a tensor's, an array's...)."""
    view = part if isinstance(part, memoryview) else memoryview(part)
    if not view.c_contiguous:
        raise ValueError("frame parts must be C-contiguous buffers")
    if view.ndim == 1 and view.format == "B":
        return view
    return view.cast("B")


def check_limits(count: int, size: int, max_frame_size: int, max_parts: int) -> None:
    if count > max_parts:
        raise FrameTooLarge(f"frame has {count} parts, more than max_parts={max_parts}")
    if size > max_frame_size:
        raise FrameTooLarge(f"frame of {size} bytes exceeds max_frame_size={max_frame_size}")


def header_struct(count: int) -> struct.Struct:
    """The precompiled header layout for ``count`` parts (cached: built once per count)."""
    layout = _HEADERS.get(count)
    if layout is None:
        layout = struct.Struct(f"<I{count}Q")
        if count <= 256:
            _HEADERS[count] = layout
    return layout


_HEADERS: dict[int, struct.Struct] = {}
_ONE_PART: Final = header_struct(1)


def encode_frame_into(
    out: MutableSequence[bytearray | memoryview],
    parts: Sequence[Buffer],
    *,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_parts: int = DEFAULT_MAX_PARTS,
    coalesce_limit: int = 64 * 1024,
    mac: FrameMac | None = None,
) -> int:
    """Append one frame to ``out`` as buffers for a vectored write; returns its size.

    Small parts are copied, with the header, onto the last bytearray of ``out`` while
    that stays under ``coalesce_limit`` (many small frames become one buffer); large
    parts are appended as views of the caller's memory, which must not change until
    written. With ``mac``, the frame joins its open run (:func:`seal_into` must follow
    before the peer hands it out) and the bytearrays of ``out`` must never be changed but
    by appending. Raises :class:`FrameTooLarge` before appending anything.
    """
    if len(parts) == 1:  # the common case, without the general path's lists
        part = parts[0]
        view = part if type(part) is bytes else as_bytes_view(part)
        size = len(view) if type(view) is bytes else view.nbytes  # type: ignore[union-attr]
        if size > max_frame_size or max_parts < 1:
            check_limits(1, size, max_frame_size, max_parts)
        tail = _tail(out, coalesce_limit)
        if mac is not None:
            mac.raw(tail)
        tail += _ONE_PART.pack(1, size)
        if size <= SMALL_PART:
            tail += view
        else:
            large = view if type(view) is memoryview else memoryview(view)
            out.append(large)
            if mac is not None:
                mac.large(large)
        return 12 + size
    if all(type(p) is bytes and len(p) <= SMALL_PART for p in parts):
        # Small bytes parts (an envelope, a body, a pickle): copied as they are, no views.
        sizes = [len(p) for p in parts]
        body = sum(sizes)
        if len(sizes) > max_parts or body > max_frame_size:
            check_limits(len(sizes), body, max_frame_size, max_parts)
        tail = _tail(out, coalesce_limit)
        if mac is not None:
            mac.raw(tail)
        tail += header_struct(len(sizes)).pack(len(sizes), *sizes)
        for part in parts:
            tail += part
        return 4 + 8 * len(sizes) + body
    views = [as_bytes_view(p) for p in parts]
    sizes = [v.nbytes for v in views]
    body = sum(sizes)
    check_limits(len(views), body, max_frame_size, max_parts)
    current: bytearray | None = _tail(out, coalesce_limit)
    if mac is not None:
        mac.raw(current)  # type: ignore[arg-type]
    current += header_struct(len(sizes)).pack(len(sizes), *sizes)  # type: ignore[operator]
    for view, size in zip(views, sizes, strict=True):
        if size <= SMALL_PART:
            if current is None:
                current = _tail(out, coalesce_limit)
                if mac is not None:
                    mac.raw(current)
            current += view
        else:
            out.append(view)
            if mac is not None:
                mac.large(view)
            current = None
    return 4 + 8 * len(sizes) + body


def seal_into(
    out: MutableSequence[bytearray | memoryview], mac: FrameMac, coalesce_limit: int = 64 * 1024
) -> int:
    """Append the seal of the frames added to ``mac`` since its last seal, if any; returns
    its size (0: nothing to seal)."""
    if not mac.open:
        return 0
    seal = mac.seal()  # before appending: the run may end in the buffer appended to
    _tail(out, coalesce_limit).extend(seal)
    return SEAL_SIZE


def _tail(out: MutableSequence[bytearray | memoryview], limit: int) -> bytearray:
    if out:
        last = out[-1]
        if type(last) is bytearray and len(last) < limit:
            return last
    tail = bytearray()
    out.append(tail)
    return tail


def encode_frame(
    parts: Sequence[Buffer],
    *,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_parts: int = DEFAULT_MAX_PARTS,
    mac: FrameMac | None = None,
) -> tuple[list[bytearray | memoryview], int]:
    """One frame as a list of buffers for a vectored write, and its total size; with
    ``mac``, sealed (a run of its own)."""
    out: list[bytearray | memoryview] = []
    size = encode_frame_into(
        out, parts, max_frame_size=max_frame_size, max_parts=max_parts, mac=mac
    )
    if mac is not None:
        size += seal_into(out, mac)
    return out, size


class FrameDecoder:
    """Reassemble frames from a byte stream delivered in arbitrary chunks.

    Usage: ``buf = get_buffer()``, fill a prefix of it with ``n`` bytes, then
    ``buffer_updated(n)``; complete frames are then available from ``next_frame()``.
    With ``mac``, frames come in sealed runs: a run's frames are available once its seal
    checks, and a seal that does not raises
    :class:`~monarch.transport.FrameAuthenticationError` (its frames are dropped).
    """

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_parts: int = DEFAULT_MAX_PARTS,
        buffer_size: int = 256 * 1024,
        min_read: int = 64 * 1024,
        mac: FrameMac | None = None,
    ) -> None:
        self.max_frame_size = max_frame_size
        self.max_parts = max_parts
        self._mac = mac
        # Not zeroed: pages of it that no read reached cost no memory, and a connection
        # that carries small messages reads into its first pages only (a controller holds
        # a connection per proc; zeroed, 256 KiB each were most of its memory).
        self._buf = fresh_bytearray(buffer_size)
        self._start = 0
        self._end = 0
        self._need = 0  # bytes from _start the pending frame needs buffered
        self._min_read = min_read
        self._large: bytearray | None = None
        self._large_size = 0
        self._large_filled = 0
        self._large_at = 0  # with a MAC: where in the large body the run has been hashed to
        self._large_part = (0, 0)  # the part there: its index and where it starts
        self._large_hash: PartMac | None = None  # the MAC of the large part being read
        self._spares: list[bytearray] = []  # recent large buffers, reused once unreferenced
        self._large_sizes: Sequence[int] = ()
        self._ready: deque[Frame] = deque()
        self._unsealed: list[Frame] = []  # complete frames whose run is not sealed yet
        self._complete = self._ready if mac is None else self._unsealed

    # -- reading side -----------------------------------------------------------

    def get_buffer(self) -> memoryview:
        """A writable buffer for the next bytes of the stream (never empty)."""
        if self._large is not None:
            return memoryview(self._large)[self._large_filled : self._large_size]
        want = max(self._min_read, self._need - (self._end - self._start))
        if len(self._buf) - self._end < want:
            self._make_room(want)
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """Record that ``nbytes`` were written at the start of the last buffer."""
        if nbytes <= 0:
            raise ValueError("buffer_updated needs a positive byte count")
        large = self._large
        if large is not None:
            self._large_filled += nbytes
            if self._large_filled > self._large_size:
                raise ValueError("more bytes reported than the buffer holds")
            if self._mac is not None:
                self._hash_large(self._large_filled)
            if self._large_filled == self._large_size:
                self._complete.append(_split(memoryview(large), self._large_sizes))
                if len(large) <= SPARE_MAX:
                    self._spares = [large, *self._spares[: SPARE_BUFFERS - 1]]
                self._large = None
                self._large_sizes = ()
            return
        if self._end + nbytes > len(self._buf):
            raise ValueError("more bytes reported than the buffer holds")
        self._end += nbytes
        self._parse()

    def feed(self, data: Buffer) -> None:
        """Copy ``data`` in (for callers that already hold bytes)."""
        view = as_bytes_view(data)
        while view.nbytes:
            buf = self.get_buffer()
            n = min(buf.nbytes, view.nbytes)
            buf[:n] = view[:n]
            buf.release()
            self.buffer_updated(n)
            view = view[n:]

    def discard(self) -> None:
        """Let go of every buffer but the frames already handed over (the stream is
        over): an unfinished large frame's memory is freed now, not when the decoder is."""
        self._large = self._large_hash = None
        self._large_at = 0
        self._large_sizes = ()
        self._large_size = self._large_filled = 0
        self._spares = []
        self._unsealed.clear()
        self._buf = bytearray()
        self._start = self._end = self._need = 0

    # -- frames -----------------------------------------------------------------

    def next_frame(self) -> Frame | None:
        """The oldest complete frame, or ``None``."""
        return self._ready.popleft() if self._ready else None

    @property
    def pending_frames(self) -> int:
        return len(self._ready)

    @property
    def mid_frame(self) -> bool:
        """True when part of a frame, or of a run, has been read (EOF now truncates it)."""
        return self._large is not None or self._end > self._start or bool(self._unsealed)

    # -- internals ----------------------------------------------------------------

    def _allocate(self, size: int) -> bytearray:
        """A buffer for a large frame: a recent one again when nothing refers to it.

        Reuse saves the page faults of touching fresh memory, which cost more than
        the copy from the kernel. Frame parts (and anything built on them, such as a
        tensor from ``torch.frombuffer``) keep a reference, which blocks reuse; two
        spares cover the usual loop that holds the previous frame while receiving.
        """
        spares = self._spares
        for i in range(len(spares)):
            # References: the list, getrefcount's argument, nothing else.
            if len(spares[i]) >= size and sys.getrefcount(spares[i]) == 2:
                return spares.pop(i)
        return fresh_bytearray(size)

    def _make_room(self, want: int) -> None:
        held = self._end - self._start
        if self._start and len(self._buf) - held >= want:
            self._buf[0:held] = self._buf[self._start : self._end]
        else:
            grown = fresh_bytearray(max(2 * len(self._buf), held + want))
            grown[0:held] = self._buf[self._start : self._end]
            self._buf = grown
        self._start, self._end = 0, held

    def _parse(self) -> None:
        buf, start, end = self._buf, self._start, self._end
        mac, complete = self._mac, self._complete
        hashed = start  # with a MAC: the bytes of buf before this are in the run already
        self._need = 0
        while end - start >= 4:
            (count,) = _COUNT.unpack_from(buf, start)
            if count == SEAL_COUNT and mac is not None:
                if end - start < SEAL_SIZE:
                    self._need = SEAL_SIZE
                    break
                mac.check(buf[start + 4 : start + SEAL_SIZE], memoryview(buf)[hashed:start])
                self._ready.extend(complete)
                complete.clear()
                start = hashed = start + SEAL_SIZE
                continue
            if count > self.max_parts:
                raise FrameTooLarge(
                    f"peer sent a frame of {count} parts, more than max_parts={self.max_parts}"
                )
            body_at = start + 4 + 8 * count
            if end < body_at:
                self._need = body_at - start
                break
            if count == 1:
                sizes = _ONE_PART.unpack_from(buf, start)[1:]
                total = sizes[0]
                if total <= end - body_at and total <= self.max_frame_size:
                    stop = body_at + total
                    body = buf[body_at:stop]
                    complete.append([memoryview(body)])
                    if mac is not None and total > DIGEST_FROM:
                        mac.absorb(memoryview(buf)[hashed:body_at])
                        part_mac = mac.next_part_mac()
                        part_mac.update(body)
                        mac.absorb(part_mac.finish())
                        hashed = stop
                    start = stop
                    continue
            else:
                sizes = header_struct(count).unpack_from(buf, start)[1:]
                total = sum(sizes)
            if total > self.max_frame_size:
                raise FrameTooLarge(
                    f"peer sent a frame of {total} bytes, more than "
                    f"max_frame_size={self.max_frame_size}"
                )
            have = end - body_at
            if have >= total:
                stop = body_at + total
                whole = memoryview(bytes(memoryview(buf)[body_at:stop]))
                parts = _split(whole, sizes)
                complete.append(parts)
                if mac is not None and total > DIGEST_FROM:
                    mac.absorb(memoryview(buf)[hashed:body_at])
                    for part in parts:
                        if part.nbytes <= DIGEST_FROM:
                            mac.absorb(part)
                        else:
                            part_mac = mac.next_part_mac()
                            part_mac.update(part)
                            mac.absorb(part_mac.finish())
                    hashed = stop
                start = stop
                continue
            if total > self._min_read:
                large = self._allocate(total)
                large[0:have] = memoryview(buf)[body_at:end]
                self._large, self._large_filled, self._large_sizes = large, have, sizes
                self._large_size = total
                if mac is not None:
                    mac.absorb(memoryview(buf)[hashed:body_at])
                    self._large_at, self._large_part = 0, (0, 0)
                    self._hash_large(have)
                start = hashed = end
            else:
                self._need = body_at + total - start
            break
        if mac is not None and hashed < start:
            mac.absorb(memoryview(buf)[hashed:start])
        if start == end:
            start = end = 0
        self._start, self._end = start, end

    def _hash_large(self, filled: int) -> None:
        """Put the large body's bytes up to ``filled`` into the run, in order: small parts
        as they are (adjacent ones in one call), large ones through their SHA-256."""
        mac, large = self._mac, self._large
        assert mac is not None and large is not None
        at, sizes = self._large_at, self._large_sizes
        index, part_at = self._large_part
        raw_from = -1  # the start of the small parts not absorbed yet
        with memoryview(large) as view:
            while at < filled:
                size = sizes[index]
                part_end = part_at + size
                stop = min(part_end, filled)
                if size <= DIGEST_FROM:
                    if raw_from < 0:
                        raw_from = at
                else:
                    if raw_from >= 0:
                        mac.absorb(view[raw_from:at])
                        raw_from = -1
                    if self._large_hash is None:
                        self._large_hash = mac.next_part_mac()
                    self._large_hash.update(view[at:stop])
                    if stop == part_end:
                        mac.absorb(self._large_hash.finish())
                        self._large_hash = None
                at = stop
                if at == part_end and index + 1 < len(sizes):
                    index, part_at = index + 1, part_end
            if raw_from >= 0:
                mac.absorb(view[raw_from:at])
        self._large_at = at
        self._large_part = (index, part_at)


def _split(body: memoryview, sizes: Sequence[int]) -> Frame:
    parts: Frame = []
    at = 0
    for size in sizes:
        parts.append(body[at : at + size])
        at += size
    return parts
