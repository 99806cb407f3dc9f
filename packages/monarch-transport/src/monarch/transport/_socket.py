"""Frames over a non-blocking socket, driven by anyio's readiness waits.

Every operation first tries the system call and waits for readiness only when it
would block, so a busy connection does one ``recvmsg``/``sendmsg`` per batch of
frames and no event-loop round trip per frame. The same code runs on asyncio
(uvloop included) and trio.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import sys
import threading
import time
import weakref
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from itertools import islice
from typing import Any, Final

import anyio
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint

from ._abc import (
    Connection,
    ConnectionAttribute,
    ConnectionHandler,
    FrameQueue,
    Listener,
    PushReceiver,
    Transport,
    TransportOptions,
)
from ._address import Address
from ._admission import Admission
from ._errors import (
    ConnectError,
    ConnectionClosed,
    HandshakeError,
    ProtocolError,
    TransportError,
    detached,
)
from ._framing import Buffer, Frame, FrameDecoder, encode_frame_into, seal_into
from ._handshake import FrameKeys, Handshake, Role, check_secret

log = logging.getLogger("monarch.transport")

WANT_READ: Final = -1
WANT_WRITE: Final = -2
IOV_MAX: Final = min(os.sysconf("SC_IOV_MAX"), 1024)
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


class SocketIO:
    """Non-blocking reads and writes of one socket; returns WANT_* instead of raising."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv_into(self, buf: memoryview) -> int:
        try:
            return self.sock.recv_into(buf)
        except (BlockingIOError, InterruptedError):
            return WANT_READ

    def send(self, bufs: deque[bytearray | memoryview]) -> int:
        try:
            return self.sock.sendmsg(islice(bufs, IOV_MAX))
        except (BlockingIOError, InterruptedError):
            return WANT_WRITE

    def pending(self) -> bool:
        """Whether bytes already read from the socket wait in user space (TLS)."""
        return False

    def channel_binding(self) -> bytes | None:
        """What binds the handshake to a secure channel whose records already authenticate
        every byte (TLS 1.3's ``tls-unique``); None: frames need their own MAC."""
        return None


async def wait_for(sock: socket.socket, want: int) -> None:
    """Wait until the socket can do what a WANT_* code asked for."""
    try:
        if want == WANT_READ:
            await anyio.wait_readable(sock)
        else:
            await anyio.wait_writable(sock)
    except anyio.ClosedResourceError:
        raise ConnectionClosed("the connection was closed") from None


class _AsyncioReadable:
    """Readability of one socket on an asyncio loop, registered once, not per wait.

    ``anyio.wait_readable`` adds and removes the reader around every wait (two
    ``epoll_ctl`` calls and some lookups per message). Here the reader stays registered
    while the connection keeps waiting; it is removed only when it fires with nobody
    waiting (being level-triggered it would fire again and again). A wake-up may be
    spurious: the receiver just tries to read and waits again.

    In push mode (``push``) the reader stays registered and calls back on every
    readiness (unless ``paused``), and once more when closed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        """The loop the socket is registered with: only it may unregister or close it."""
        self._fd = sock.fileno()
        self._waiter: asyncio.Future[None] | None = None
        self._registered = False
        self._closed = False
        self._push: Callable[[], object] | None = None
        self.paused = False

    def push(self, ready: Callable[[], object]) -> None:
        """Call ``ready()`` whenever the socket is readable (from the loop), until closed."""
        if self._closed:
            raise ConnectionClosed("the connection was closed")
        self._push = ready
        if self._registered:
            self.loop.remove_reader(self._fd)
        if not self.paused:
            self.loop.add_reader(self._fd, ready)
        self._registered = not self.paused

    def pause(self) -> None:
        """Push mode: no callback until ``resume`` (the socket is not watched)."""
        if not self.paused:
            self.paused = True
            if self._registered and self._push is not None:
                self.loop.remove_reader(self._fd)
                self._registered = False

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            if self._push is not None and not self._closed and not self._registered:
                self.loop.add_reader(self._fd, self._push)
                self._registered = True

    async def wait(self) -> None:
        if self._closed:
            raise ConnectionClosed("the connection was closed")
        waiter = self._waiter = self.loop.create_future()
        if not self._registered:
            self.loop.add_reader(self._fd, self._ready)
            self._registered = True
        try:
            await waiter
        finally:
            self._waiter = None

    def _ready(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            self.loop.remove_reader(self._fd)
            self._registered = False
        else:
            waiter.set_result(None)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._registered:
            self.loop.remove_reader(self._fd)
            self._registered = False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionClosed("the connection was closed"))
        if self._push is not None:
            self.loop.call_soon(self._push)  # the receiver learns of it from receive_nowait


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
        self._readable: _AsyncioReadable | None = None
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

    def _asyncio_readable(self) -> _AsyncioReadable | None:
        """The socket's readability on the running asyncio loop (made on first use), or
        None on another backend (trio: anyio's waits it is)."""
        if not self._backend_known:
            self._backend_known = True
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                self._readable = _AsyncioReadable(loop, self._sock)
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


async def send_all(io: SocketIO, data: bytes) -> None:
    queue: deque[bytearray | memoryview] = deque([memoryview(data)])
    while queue:
        sent = io.send(queue)
        if sent < 0:
            await wait_for(io.sock, sent)
            continue
        head = queue.popleft()
        if sent < len(head):
            queue.appendleft(head[sent:])


async def run_handshake(
    io: SocketIO, role: Role, secret: bytes
) -> tuple[int, bytes, FrameKeys | None]:
    """Drive :class:`Handshake` over ``io``; returns the version, the bytes read past it
    and the keys of the frames (None where the channel authenticates them)."""
    handshake = Handshake(role, secret, channel_binding=io.channel_binding())
    buf = bytearray(4096)
    await send_all(io, handshake.data_to_send())
    while handshake.wants_more:
        with memoryview(buf) as view:
            n = io.recv_into(view)
        if n < 0:
            await wait_for(io.sock, n)
            continue
        if n == 0:
            raise HandshakeError("peer closed the connection during the handshake")
        try:
            handshake.receive_data(bytes(buf[:n]))
        finally:
            reply = handshake.data_to_send()
            if reply:
                try:
                    await send_all(io, reply)
                except (OSError, TransportError):
                    if handshake.wants_more:
                        raise
    assert handshake.version is not None
    return handshake.version, handshake.leftover, handshake.frame_keys


class SocketTransport(Transport):
    """A transport over stream sockets: subclasses open, bind and describe sockets."""

    @abstractmethod
    async def open_socket(self, address: Address, options: TransportOptions) -> socket.socket:
        """A connected non-blocking socket to ``address``."""

    @abstractmethod
    async def bind_socket(
        self, address: Address, options: TransportOptions
    ) -> tuple[socket.socket, Address]:
        """A listening non-blocking socket and its real address."""

    @abstractmethod
    def peer_address(self, sock: socket.socket) -> Address: ...

    def socket_attributes(self, sock: socket.socket) -> dict[Any, Callable[[], Any]]:
        return {}

    async def secure(
        self, sock: socket.socket, options: TransportOptions, *, server_side: bool, address: Address
    ) -> SocketIO:
        """Wrap the socket for I/O (TLS does its handshake here)."""
        return SocketIO(sock)

    def unbind(self, address: Address) -> None:
        """Release what ``bind_socket`` claimed beyond the socket (a socket file)."""

    async def connect(self, address: Address, options: TransportOptions) -> Connection:
        address = self.check_address(address)
        check_secret(options.secret)
        try:
            with anyio.fail_after(options.connect_timeout):
                sock = await self.open_socket(address, options)
        except TimeoutError:
            raise ConnectError(
                f"cannot connect to {address}: timed out after {options.connect_timeout}s"
            ) from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {address}: {exc}") from exc
        return await self.establish(
            sock, options, "client", local=self.local_address(sock), remote=address
        )

    @abstractmethod
    def local_address(self, sock: socket.socket) -> Address: ...

    async def establish(
        self,
        sock: socket.socket,
        options: TransportOptions,
        role: Role,
        *,
        local: Address,
        remote: Address,
    ) -> SocketConnection:
        """Secure and authenticate a connected socket within the handshake deadline.

        Closes the socket (and its TLS wrapper) when anything fails.
        """
        io: SocketIO | None = None
        try:
            with anyio.fail_after(options.handshake_timeout):
                io = await self.secure(sock, options, server_side=role == "server", address=remote)
                version, leftover, keys = await run_handshake(io, role, options.secret)
        except BaseException as exc:
            if io is not None:
                io.sock.close()
            sock.close()
            if isinstance(exc, TimeoutError):
                raise HandshakeError(
                    f"handshake with {remote} timed out after {options.handshake_timeout}s"
                ) from None
            ssl = sys.modules.get("ssl")  # loaded only by the tls transport
            if ssl is not None and isinstance(exc, ssl.SSLError):
                raise HandshakeError(f"TLS handshake with {remote} failed: {exc}") from exc
            if isinstance(exc, OSError):
                raise HandshakeError(
                    f"connection to {remote} lost in the handshake: {exc}"
                ) from exc
            raise
        secured = io.sock
        attributes: dict[Any, Callable[[], Any]] = {
            ConnectionAttribute.transport: lambda: self.scheme,
            ConnectionAttribute.local_address: lambda: local,
            ConnectionAttribute.remote_address: lambda: remote,
            ConnectionAttribute.protocol_version: lambda: version,
            ConnectionAttribute.raw_socket: lambda: secured,
            **self.socket_attributes(secured),
        }
        return SocketConnection(io, options, leftover=leftover, attributes=attributes, keys=keys)

    async def listen(self, address: Address, options: TransportOptions) -> Listener:
        address = self.check_address(address)
        check_secret(options.secret)
        sock, real = await self.bind_socket(address, options)
        return SocketListener(self, sock, real, options)


async def accept_connection(
    sock: socket.socket, closed: Callable[[], bool], where: object
) -> socket.socket | None:
    """The next connection accepted on the listening ``sock`` (non-blocking), or None once
    ``closed()`` or the socket is closed; a failure such as running out of descriptors is
    logged and retried once some may have freed up (shared by every listener)."""
    while not closed():
        try:
            raw, _ = sock.accept()
        except (BlockingIOError, InterruptedError):
            try:
                await anyio.wait_readable(sock)
            except anyio.ClosedResourceError:
                return None
            continue
        except OSError as exc:
            if sock.fileno() < 0:
                return None
            log.error("accept on %s failed: %s", where, exc)
            await anyio.sleep(0.1)
            continue
        raw.setblocking(False)
        return raw
    return None


class SocketListener(Listener):
    def __init__(
        self,
        transport: SocketTransport,
        sock: socket.socket,
        address: Address,
        options: TransportOptions,
    ) -> None:
        self._transport = transport
        self._sock = sock
        self._address = address
        self._options = options
        self._closed = False

    @property
    def address(self) -> Address:
        return self._address

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._address}{' closed' if self._closed else ''}>"

    async def serve(self, handler: ConnectionHandler, task_group: TaskGroup | None = None) -> None:
        """Accept every connection at once and let it do its handshake, keeping at most
        ``max_pending_handshakes`` unauthenticated ones (``Admission``: a flood of silent or
        slow connections evicts itself, it does not queue the job's own peers behind it)."""
        async with AsyncExitStack() as stack:
            if task_group is None:
                task_group = await stack.enter_async_context(anyio.create_task_group())
            admission = Admission(self._options.max_pending_handshakes, self._address)
            while not self._closed:
                raw = await self._accept()
                if raw is None:
                    return
                try:
                    remote = self._transport.peer_address(raw)
                except OSError:
                    raw.close()
                    continue
                scope = anyio.CancelScope()
                admission.admit(remote.host if remote.port is not None else "", scope)
                task_group.start_soon(self._handle, raw, remote, handler, admission, scope)
                await checkpoint()  # an evicted handshake closes before the next accept

    async def _accept(self) -> socket.socket | None:
        """The next connection (non-blocking), or None once the listener is closed."""
        return await accept_connection(self._sock, lambda: self._closed, self._address)

    async def _handle(
        self,
        raw: socket.socket,
        remote: Address,
        handler: ConnectionHandler,
        admission: Admission,
        scope: anyio.CancelScope,
    ) -> None:
        conn: SocketConnection | None = None
        try:
            with scope:
                conn = await self._establish(raw, remote)
        except TransportError as exc:
            admission.dropped(f"{remote}: {exc}")
            return
        finally:
            admission.release(scope)
        if conn is None:
            admission.dropped(f"{remote}: evicted by a newer connection, still unauthenticated")
            return
        async with conn:
            try:
                await handler(conn)
            except Exception:
                log.exception("connection handler for %s failed; closing that connection", remote)

    async def _establish(self, raw: socket.socket, remote: Address) -> SocketConnection:
        """The handshake of an accepted connection, which must send its first bytes within
        ``hello_timeout`` (a peer with the secret sends its hello at once); the socket is
        closed if anything fails."""
        deadline = min(self._options.hello_timeout, self._options.handshake_timeout)
        try:
            with anyio.move_on_after(deadline) as silent:
                await anyio.wait_readable(raw)
        except BaseException:
            raw.close()
            raise
        if silent.cancelled_caught:
            raw.close()
            raise HandshakeError(f"handshake timed out: nothing sent within {deadline}s")
        return await self._transport.establish(
            raw, self._options, "server", local=self._address, remote=remote
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        anyio.notify_closing(self._sock)
        self._sock.close()
        self._transport.unbind(self._address)
        await checkpoint()
