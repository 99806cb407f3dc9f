"""The connection's fast send path: the transport's where it offers one, else ours.

A writer to a peer queues many frames and writes them in one call, skips a task switch
when the socket has room, and sends heartbeats from a thread of their own: all through a
``FrameQueue`` (``monarch.transport``). A transport offers its own where it can
(``ConnectionAttribute.frame_queue``); over one that offers only ``send``, ``SendQueue``
gives the same interface, the runtime's loop writing the frames one ``send`` at a time.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Sequence

from monarch.transport import Buffer, Connection, ConnectionAttribute, FrameQueue, TransportError


def frame_queue(conn: Connection, loop: asyncio.AbstractEventLoop) -> FrameQueue:
    """``conn``'s fast send path, or a ``SendQueue`` over its ``send`` on ``loop``."""
    queue = conn.extra(ConnectionAttribute.frame_queue, None)
    return queue if queue is not None else SendQueue(conn, loop)


class SendQueue(FrameQueue):
    """A ``FrameQueue`` over a connection that has only ``send``.

    Only the loop writes (one ``send`` per frame, in order), so ``flush_nowait`` and
    ``flush_for`` write nothing and say only whether anything waits, and
    ``send_threadsafe`` hands the write to the loop.
    """

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self._frames: deque[tuple[Sequence[Buffer], int]] = deque()
        self._lock = threading.Lock()
        self._unsent = 0
        self._writing: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def send_nowait(self, parts: Sequence[Buffer]) -> None:
        size = sum(memoryview(part).nbytes for part in parts)
        with self._lock:
            self._frames.append((parts, size))
            self._unsent += size

    async def flush(self) -> None:
        if self._writing is None:
            self._writing = asyncio.Lock()
        async with self._writing:  # one writer at a time keeps the frames in order
            while True:
                with self._lock:
                    if not self._frames:
                        return
                    parts, size = self._frames.popleft()
                try:
                    await self._conn.send(parts)
                finally:
                    with self._lock:
                        self._unsent -= size

    def flush_nowait(self) -> bool:
        return not self._frames

    def send_threadsafe(self, parts: Sequence[Buffer], timeout: float = 0.0) -> bool:
        self.send_nowait(parts)
        self._loop.call_soon_threadsafe(self._write_soon)
        return False

    def _write_soon(self) -> None:
        task = self._loop.create_task(self._flush_quietly())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_quietly(self) -> None:
        try:
            await self.flush()
        except TransportError:
            pass  # the connection is gone; its reader reports that

    @property
    def unsent(self) -> int:
        return self._unsent

    def flush_for(self, seconds: float, keep: int = 0) -> bool:
        return self._unsent <= keep
