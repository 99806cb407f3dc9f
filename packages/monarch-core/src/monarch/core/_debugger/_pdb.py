"""pdb in an actor, with the root client's console for a terminal.

The session's lines cannot ride the runtime's messages: a breakpoint in an async actor
blocks the runtime's loop (it runs there), so nothing would be read. A debugger has a
connection of its own (``_Link``) to the root's ``debug`` service, driven by a thread with
its own loop; the paused thread blocks on it, as pdb blocks on a terminal.
"""

from __future__ import annotations

import asyncio
import bdb
import io
import linecache
import os
import pdb
import socket
import threading
from collections.abc import Coroutine
from types import FrameType, TracebackType
from typing import IO, Any, TypeVar, cast

import msgspec

from monarch.core._runtime import Runtime, dial
from monarch.core._runtime._messages import (
    DebugEnd,
    DebugInput,
    DebugLines,
    DebugMessage,
    DebugRead,
    DebugSource,
    DebugStart,
    DebugWrite,
    Hello,
    decode_debug,
    encode,
    encode_body,
)
from monarch.transport import Connection, TransportError

from ._sessions import SERVICE_NAME

T = TypeVar("T")

LINK_TIMEOUT = 30.0
"""Seconds to reach the root's debug service before the breakpoint gives up."""


class _Link:
    """A connection to the root's ``debug`` service, usable from any blocked thread."""

    def __init__(self, runtime: Runtime) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="monarch-debugger", daemon=True
        )
        self.thread.start()
        self.conn: Connection = self._run(self._open(runtime), LINK_TIMEOUT)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)
        except (TransportError, OSError, TimeoutError) as exc:
            raise bdb.BdbQuit(f"the debugger's console is gone: {exc}") from exc

    @staticmethod
    async def _open(runtime: Runtime) -> Connection:
        conn = await dial(runtime, runtime.root or runtime.address)
        await conn.send([encode(Hello(runtime.address, service=SERVICE_NAME))])
        return conn

    def send(self, message: DebugMessage) -> None:
        self._run(self.conn.send([encode_body(message)]))

    def receive(self) -> DebugMessage:
        frame = self._run(self.conn.receive())
        message: DebugMessage = decode_debug(frame[0])
        return message

    def close(self) -> None:
        try:
            self._run(self.conn.aclose(), LINK_TIMEOUT)
        except bdb.BdbQuit:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)


class _Input(io.TextIOBase):
    """pdb's stdin: each line comes from the console."""

    def __init__(self, debugger: RemotePdb) -> None:
        self.debugger = debugger

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        link = self.debugger.link
        link.send(DebugRead())
        answer = link.receive()
        if not isinstance(answer, DebugInput):
            raise bdb.BdbQuit(f"the console sent {type(answer).__name__}")
        return answer.line + "\n"


class _Output(io.TextIOBase):
    """pdb's stdout: each write goes to the console, with where the frame is paused."""

    def __init__(self, debugger: RemotePdb) -> None:
        self.debugger = debugger

    def write(self, text: str) -> int:
        self.debugger.link.send(DebugWrite(text, *_where(self.debugger.curframe)))
        return len(text)

    def flush(self) -> None:
        pass


class RemotePdb(pdb.Pdb):
    """pdb for one actor rank; its session lasts from a stop until the actor runs on
    with no breakpoint left (``continue``) or quits."""

    def __init__(self, runtime: Runtime, start: DebugStart) -> None:
        self.link = _Link(runtime)
        self.start = start
        self.started = False
        self.stopped_in: tuple[FrameType, ...] = ()
        """The stack of the last breakpoint: an exception through it is post-mortem'd."""
        self.asked: set[str] = set()
        """Files whose source was asked of the root (see ``fetch_sources``)."""
        super().__init__(stdin=cast(IO[str], _Input(self)), stdout=cast(IO[str], _Output(self)))
        self.use_rawinput = False  # read through self.stdin, not input()

    def interaction(self, frame: FrameType | None, tb: TracebackType | None) -> None:
        last = tb
        while last is not None and last.tb_next is not None:
            last = last.tb_next
        where = frame if frame is not None else last.tb_frame if last is not None else None
        self.fetch_sources(where)
        if not self.started:
            function, line = _where(where)
            self.link.send(msgspec.structs.replace(self.start, function=function, lineno=line))
            self.started = True
            tb = last
        super().interaction(frame, tb)

    def fetch_sources(self, frame: FrameType | None) -> None:
        """Source this process cannot read, of the paused stack's code (the client's
        script or notebook cell, pickled by value), asked of the root, where it was
        written, into this process's linecache: ``list`` and the stack show it."""
        while frame is not None:
            name = frame.f_code.co_filename
            if name not in self.asked and not linecache.getlines(name, frame.f_globals):
                self.asked.add(name)
                self.link.send(DebugSource(name))
                answer = self.link.receive()
                if isinstance(answer, DebugLines) and answer.lines:
                    size = sum(len(line) for line in answer.lines)
                    linecache.cache[name] = (size, None, list(answer.lines), name)
            frame = frame.f_back

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:
            self.end_session()

    def set_quit(self) -> None:
        super().set_quit()
        self.end_session()

    def do_clear(self, arg: str) -> None:
        """``clear`` with no argument clears every breakpoint without asking (the
        question would read past our stdin)."""
        if arg:
            super().do_clear(arg)
        else:
            self.clear_all_breaks()

    def end_session(self) -> None:
        if self.started:
            self.started = False
            self.link.send(DebugEnd())

    def post_mortem(self, tb: TracebackType) -> None:
        """Stop at the frame ``tb`` ends in (an endpoint that raised)."""
        self.reset()
        self.interaction(None, tb)
        self.end_session()


def _where(frame: FrameType | None) -> tuple[str, int]:
    """``module.function`` and line of ``frame``, as ``list`` shows them."""
    if frame is None:
        return "", 0
    module = os.path.splitext(os.path.basename(frame.f_code.co_filename))[0]
    return f"{module}.{frame.f_code.co_name}", frame.f_lineno


def hostname() -> str:
    return socket.gethostname()
