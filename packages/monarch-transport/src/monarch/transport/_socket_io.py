"""Non-blocking reads and writes of one socket, and the waits for its readiness.

The pieces under every socket connection (``_socket``) and its handshake
(``_socket_transport``): a system call is tried first and returns a ``WANT_*`` code
instead of raising when it would block; the caller then waits for readiness.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Final

import anyio

from ._errors import ConnectionClosed

WANT_READ: Final = -1
WANT_WRITE: Final = -2
IOV_MAX: Final = min(os.sysconf("SC_IOV_MAX"), 1024)


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


class AsyncioReadable:
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
