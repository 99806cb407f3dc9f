"""Frames over a connected non-blocking socket, driven by anyio's readiness waits.

Every operation first tries the system call and waits for readiness only when it
would block, so a busy connection does one ``recvmsg``/``sendmsg`` per batch of
frames and no event-loop round trip per frame. The same code runs on asyncio
(uvloop included) and trio.
"""

from __future__ import annotations

import asyncio
import logging
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import anyio
from anyio.lowlevel import checkpoint

from ._abc import (
    Connection,
    ConnectionAttribute,
    FrameQueue,
    PushReceiver,
    TransportOptions,
)
from ._errors import (
    ConnectionClosed,
    ProtocolError,
    TransportError,
    detached,
)
from ._framing import Buffer, Frame, FrameDecoder, encode_frame_into, seal_into
from ._handshake import FrameKeys
from ._socket_io import WANT_READ, WANT_WRITE, AsyncioReadable, SocketIO, wait_for

log = logging.getLogger("monarch.transport")

COALESCE_LIMIT: Final = 64 * 1024
"""Small frames are appended to the last queued buffer while it is below this size."""
CHECKPOINT_EVERY: Final = 64
"""Operations that completed without waiting between two forced checkpoints."""
PUSH_READS: Final = 8
"""Reads one readiness may do in push mode before letting the loop run others."""
_CLOSED_ERRORS: Final = (anyio.ClosedResourceError, OSError)

Attributes = Mapping[Any, Callable[[], Any]]


def _nothing() -> None:
    pass


class SocketConnection(Connection, FrameQueue, PushReceiver):
    """A :class:`Connection` over a connected, authenticated, non-blocking socket.

    It is its own fast path and push receiver (``ConnectionAttribute.frame_queue``,
    ``ConnectionAttribute.push_receiver``): a capability costs no indirection here.
    """

    def __init__(
        self,
        io: SocketIO,
        options: TransportOptions,
        *,
        leftover: bytes = b"",
        attributes: Attributes,
        keys: FrameKeys | None = None,
    ) -> None:
        self._io = io
        self._sock = io.sock
        self._readable: AsyncioReadable | None = None
        self._closing: asyncio.Task[None] | None = None
        self._backend_known = False
        self._options = options
        send_mac, receive_mac = keys.macs() if keys is not None else (None, None)
        self._send_mac = send_mac
        self._decoder = FrameDecoder(
            max_frame_size=options.max_frame_size, max_parts=options.max_parts, mac=receive_mac
        )
        self._queue: deque[bytearray | memoryview] = deque()
        self._send_lock = threading.RLock()
        """Held while writing from the queue and while failing: a caller may send from
        another thread than the one receiving, and a failed read closes the socket."""
        self._queued = 0  # bytes ever queued
        self._written = 0  # bytes ever written
        self._flushing = False
        self._progress: anyio.Event | None = None
        self._receiving = False
        self._pushing = False
        self._receive_error: TransportError | None = None
        """What ended reading while frames were still to be handed out: raised (a copy)
        once they run out."""
        self._on_frames: Callable[[], object] = _nothing
        self._closed = False
        self._failure: BaseException | None = None
        self._fast_ops = 0
        self._attributes: Attributes = {
            **attributes,
            # Weakly: a failed connection is freed by reference counts, with no cycle.
            ConnectionAttribute.frame_queue: weakref.ref(self),
            ConnectionAttribute.push_receiver: weakref.ref(self),
        }
        if leftover:
            self._decoder.feed(leftover)

    @property
    def extra_attributes(self) -> Attributes:
        return self._attributes

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        peer = self._attributes.get(ConnectionAttribute.remote_address)
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {peer() if peer else '?'} {state}>"

    # -- sending -------------------------------------------------------------------

    def send_nowait(self, parts: Sequence[Buffer]) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")
        self._queued += encode_frame_into(
            self._queue,
            parts,
            max_frame_size=self._options.max_frame_size,
            max_parts=self._options.max_parts,
            coalesce_limit=COALESCE_LIMIT,
            mac=self._send_mac,
        )

    async def send(self, parts: Sequence[Buffer]) -> None:
        self.send_nowait(parts)
        await self.flush()

    def send_threadsafe(self, parts: Sequence[Buffer], timeout: float = 0.0) -> bool:
        with self._send_lock:
            self.send_nowait(parts)
            self._seal()
        return self.flush_for(timeout)

    def _seal(self) -> None:
        """Close the run of frames queued since the last flush with its seal."""
        if self._send_mac is not None:
            with self._send_lock:  # a run may be added to from another thread
                self._queued += seal_into(self._queue, self._send_mac, COALESCE_LIMIT)

    async def flush(self) -> None:
        self._seal()
        target = self._queued
        waited = False
        while self._written < target:
            if self._failure is not None:
                raise ConnectionClosed(f"connection failed: {self._failure}") from self._failure
            if not self._flushing:
                waited |= await self._drain()
            else:
                if self._progress is None:
                    self._progress = anyio.Event()
                await self._progress.wait()
                waited = True
        if not waited:
            await self._fast_checkpoint()

    def flush_nowait(self) -> bool:
        queue = self._queue
        self._seal()
        with self._send_lock:
            if self._flushing or self._failure is not None:
                return not queue
            while queue:
                if self._write_some() < 0:
                    return False
            return True

    @property
    def unsent(self) -> int:
        return self._queued - self._written

    def flush_for(self, seconds: float, keep: int = 0) -> bool:
        deadline = time.monotonic() + seconds
        poll: select.poll | None = None
        self._seal()  # the peer hands out none of a run's frames before its seal
        while self._queued - self._written > keep:
            with self._send_lock:
                if self._failure is not None:
                    raise ConnectionClosed(f"connection failed: {self._failure}")
                sent = self._write_some()
            left = deadline - time.monotonic()
            if left <= 0:
                return self._queued - self._written <= keep
            if sent >= 0:
                continue
            if poll is None:
                poll = select.poll()
                poll.register(self._sock, select.POLLOUT if sent == WANT_WRITE else select.POLLIN)
            poll.poll(left * 1000)
        return True

    def _write_some(self) -> int:
        """One write from the queue (the send lock held): bytes written, or WANT_WRITE."""
        if not self._queue:
            return 0  # another thread wrote it all since the caller looked
        try:
            sent = self._io.send(self._queue)
        except OSError as exc:
            self._fail(exc)
            raise ConnectionClosed(f"connection lost while sending: {exc}") from exc
        if sent >= 0:
            self._consume(sent)
        return sent

    async def _drain(self) -> bool:
        """Write until the queue is empty; returns whether it had to wait."""
        self._flushing = True
        waited = False
        try:
            while self._queue:
                with self._send_lock:
                    if self._failure is not None:
                        raise ConnectionClosed(f"connection failed: {self._failure}")
                    sent = self._write_some()
                if sent >= 0:
                    continue
                self._wake()
                waited = True
                await wait_for(self._sock, sent)
        finally:
            self._flushing = False
            self._wake()
        return waited

    def _consume(self, sent: int) -> None:
        self._written += sent
        queue = self._queue
        while sent:
            head = queue[0]
            size = len(head)
            if sent >= size:
                queue.popleft()
                sent -= size
            else:
                # A view of the rest, not ``del head[:sent]``: a send buffer is never
                # changed but by appending, as the frame MAC hashes runs where they are.
                queue[0] = (memoryview(head) if type(head) is bytearray else head)[sent:]
                sent = 0
        while queue and not queue[0]:
            queue.popleft()

    def _wake(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    # -- receiving ---------------------------------------------------------------------

    def frames_ready(self) -> bool:
        return bool(self._decoder.pending_frames) or self._receive_error is not None or self._closed

    def receive_nowait(self) -> Frame:
        frame = self._decoder.next_frame()
        if frame is None:
            if self._receive_error is not None:
                raise detached(self._receive_error)
            self._check_open()
            raise anyio.WouldBlock
        return frame

    def start_receiving(self, on_frames: Callable[[], object]) -> bool:
        readable = self._asyncio_readable()
        if readable is None:  # not asyncio (trio)
            return False
        self._check_open()
        if self._receiving or self._pushing:
            raise anyio.BusyResourceError("receiving from")
        self._pushing = True
        self._on_frames = on_frames
        readable.push(self._read_pushed)
        if self._decoder.pending_frames:  # read with the handshake, or by receive()
            readable.loop.call_soon(on_frames)
        return True

    def pause_receiving(self) -> None:
        if self._pushing and self._readable is not None:
            self._readable.pause()

    def resume_receiving(self) -> None:
        readable = self._readable
        if self._pushing and readable is not None and readable.paused:
            readable.resume()
            if self._io.pending():  # decrypted bytes that no readiness will announce
                readable.loop.call_soon(self._read_pushed)

    def _read_pushed(self) -> None:
        """The socket is readable (push mode, on the loop): read, then tell the receiver.

        One read per readiness while it leaves room in the buffer: the socket is then
        drained, and the loop's level-triggered poll comes back if more arrives (no
        system call to learn that it would block). A full buffer, a large frame or TLS
        bytes already decrypted are read on, a few times at most per call.
        """
        if self._closed:
            self._decoder.discard()
            self._on_frames()  # receive_nowait says why
            return
        readable = self._readable
        if readable is not None and readable.paused:
            return  # a late call (TLS bytes pending): resume_receiving reads on
        io = self._io
        for _ in range(PUSH_READS):
            try:
                n, room = self._read()
            except TransportError as exc:
                self._receive_error = detached(exc)
                break
            if n < 0:
                break  # spurious, or TLS wants to write first: the poll comes back
            if n < room and not io.pending():
                break
        else:
            if io.pending() and readable is not None:
                # decrypted bytes that the socket's readiness will not announce
                readable.loop.call_soon(self._read_pushed)
        if self._decoder.pending_frames or self._receive_error is not None:
            self._on_frames()

    def _read(self) -> tuple[int, int]:
        """One read into the decoder: the bytes read (or a WANT_* code) and the room
        there was. A failed or ended stream fails the connection and raises."""
        decoder = self._decoder
        buf = decoder.get_buffer()
        room = len(buf)
        try:
            n = self._io.recv_into(buf)
        except OSError as exc:
            self._fail(exc)
            decoder.discard()
            raise ConnectionClosed(f"connection lost while receiving: {exc}") from exc
        finally:
            buf.release()
        if n > 0:
            try:
                decoder.buffer_updated(n)
            except ProtocolError as exc:
                self._protocol_violation(exc)
                decoder.discard()
                raise
        elif n == 0:
            if decoder.mid_frame:
                # Not one exception object logged and raised: kept in this frame's locals,
                # it would hold its own traceback (and this connection) in a cycle.
                self._protocol_violation(ProtocolError("peer closed the connection mid-frame"))
                decoder.discard()
                raise ProtocolError("peer closed the connection mid-frame")
            self._fail(ConnectionClosed("peer closed the connection"))
            raise ConnectionClosed("peer closed the connection")
        return n, room

    async def receive(self) -> Frame:
        frame = self._decoder.next_frame()
        if frame is not None:
            await self._fast_checkpoint()
            return frame
        if self._receive_error is not None:
            raise detached(self._receive_error)
        self._check_open()
        if self._receiving or self._pushing:
            raise anyio.BusyResourceError("receiving from")
        self._receiving = True
        try:
            while True:
                try:
                    n, _ = self._read()
                except TransportError as exc:
                    # Frames that came whole before the failure are handed out first.
                    frame = self._decoder.next_frame()
                    if frame is None:
                        raise
                    self._receive_error = detached(exc)
                    return frame
                if n < 0:
                    await self._wait(n)
                    continue
                frame = self._decoder.next_frame()
                if frame is not None:
                    return frame
        finally:
            self._receiving = False

    # -- closing --------------------------------------------------------------------

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        unsealed = self._send_mac is not None and self._send_mac.open
        if (self._queue or unsealed) and self._failure is None:
            with anyio.move_on_after(self._options.close_timeout, shield=True):
                try:
                    await self.flush()
                except TransportError:
                    pass
        self._close_socket()
        self._decoder.discard()  # a receiver waiting now wakes up to ConnectionClosed

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionClosed("the connection is closed")

    def _protocol_violation(self, exc: ProtocolError) -> None:
        log.warning("closing connection to %s: %s", self._peer_text(), exc)
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._send_lock:  # not while another thread is writing
            if self._failure is None:
                self._failure = detached(exc)
            self._closed = True
            self._queue.clear()
            self._close_socket()

    async def _wait(self, want: int) -> None:
        readable = self._asyncio_readable()
        if want == WANT_READ and readable is not None:
            await readable.wait()
        else:
            await wait_for(self._sock, want)

    def _asyncio_readable(self) -> AsyncioReadable | None:
        """The socket's readability on the running asyncio loop (made on first use), or
        None on another backend (trio: anyio's waits it is)."""
        if not self._backend_known:
            self._backend_known = True
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                self._readable = AsyncioReadable(loop, self._sock)
        return self._readable

    def _close_socket(self) -> None:
        if self._sock.fileno() < 0:
            return
        readable = self._readable
        if readable is not None:
            if asyncio._get_running_loop() is not readable.loop:
                # Another thread's write failed: the loop that watches this socket
                # unregisters it and closes it (the connection is already failed).
                readable.loop.call_soon_threadsafe(self._close_socket)
                return
            readable.close()
        try:
            anyio.notify_closing(self._sock)  # wakes a flush waiting for writability
        except RuntimeError:  # anyio.NoEventLoopError: no task here
            # Called from an event-loop callback, outside any task (a failed
            # flush_nowait): let a task wake the waiters, then close.
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._sock.close()
            else:
                self._closing = loop.create_task(self._notify_and_close())
            return
        self._sock.close()

    async def _notify_and_close(self) -> None:
        anyio.notify_closing(self._sock)
        self._sock.close()

    def _peer_text(self) -> str:
        getter = self._attributes.get(ConnectionAttribute.remote_address)
        return str(getter()) if getter else "?"

    async def _fast_checkpoint(self) -> None:
        self._fast_ops += 1
        if self._fast_ops >= CHECKPOINT_EVERY:
            self._fast_ops = 0
            await checkpoint()
