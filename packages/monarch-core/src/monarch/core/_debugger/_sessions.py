"""The root client's side of breakpoints: one session per paused actor rank.

A proc whose actor hit ``breakpoint()`` opens a connection to the root's ``debug`` service
(``Runtime.services``) and says ``DebugStart``; then the pdb there writes (``DebugWrite``)
and asks for lines (``DebugRead``), which the console (``_console``) answers
(``DebugInput``) for the session the user attached to; ``DebugEnd`` (the actor runs on)
or a closed connection (its proc died) ends the session. Everything here runs on the
root runtime's loop.
"""

from __future__ import annotations

import asyncio
import linecache
import logging
from collections.abc import Callable, Iterator

import msgspec

from monarch.core._runtime._messages import (
    DebugEnd,
    DebugInput,
    DebugLines,
    DebugRead,
    DebugSource,
    DebugStart,
    DebugWrite,
    decode_debug,
    encode_body,
)
from monarch.transport import Connection, TransportError

from ._commands import Ranks, selects

log = logging.getLogger("monarch.debugger")

SERVICE_NAME = "debug"
"""The root's service (``Runtime.services``) that procs' debuggers connect to."""


class DebugSessionInfo(msgspec.Struct, frozen=True):
    """A paused actor rank, as ``list`` shows it (upstream's fields)."""

    actor_name: str
    rank: int
    coords: dict[str, int]
    hostname: str
    function: str | None
    lineno: int | None


class Session:
    """One paused actor rank: what its pdb printed since the last line it was sent, and
    whether it waits for one."""

    def __init__(self, start: DebugStart, conn: Connection) -> None:
        self.start = start
        self.actor_name = start.actor_name
        self.rank = start.rank
        self.conn = conn
        self.function: str | None = start.function or None
        self.lineno: int | None = start.lineno or None
        self.backlog: list[str] = []
        """Output since the last line sent: shown again to whoever attaches."""
        self.unseen: list[str] = []
        """Output the attached console has not shown yet."""
        self.reading = False
        self.ended = False
        self.changed = asyncio.Event()

    def info(self) -> DebugSessionInfo:
        start = self.start
        return DebugSessionInfo(
            self.actor_name,
            self.rank,
            dict(start.coords),
            start.hostname,
            self.function,
            self.lineno,
        )

    def wrote(self, write: DebugWrite) -> None:
        if write.function:
            self.function, self.lineno = write.function, write.lineno
        self.backlog.append(write.text)
        self.unseen.append(write.text)
        self.changed.set()

    async def send_line(self, line: str) -> None:
        """Give the waiting pdb ``line`` (the caller saw ``reading``)."""
        self.reading = False
        self.backlog.clear()
        await self.conn.send([encode_body(DebugInput(line))])

    async def next_line_wanted(self) -> bool:
        """Wait until the pdb asks for a line (True) or the session ends (False)."""
        while not self.reading and not self.ended:
            self.changed.clear()
            await self.changed.wait()
        return not self.ended


class Sessions:
    """The root's sessions by actor mesh name and rank."""

    def __init__(self) -> None:
        self.by_name: dict[str, dict[int, Session]] = {}
        self.arrived = asyncio.Event()
        self.on_start: Callable[[Session], None] = lambda session: None

    def add(self, session: Session) -> None:
        name, n = session.actor_name, 1
        while session.rank in self.by_name.get(session.actor_name, {}):  # two meshes of a name
            n += 1
            session.actor_name = f"{name}-{n}"
        ranks = self.by_name.setdefault(session.actor_name, {})
        ranks[session.rank] = session
        self.arrived.set()
        self.on_start(session)

    def remove(self, session: Session) -> None:
        session.ended = True
        session.changed.set()
        ranks = self.by_name.get(session.actor_name, {})
        if ranks.get(session.rank) is session:
            del ranks[session.rank]
            if not ranks:
                del self.by_name[session.actor_name]
        if not self.by_name:
            self.arrived.clear()

    def get(self, actor_name: str, rank: int) -> Session:
        ranks = self.by_name.get(actor_name)
        if ranks is None:
            raise ValueError(f"No debug sessions for actor {actor_name}")
        if rank not in ranks:
            raise ValueError(f"No debug session for rank {rank} for actor {actor_name}")
        return ranks[rank]

    def select(
        self, actor_name: str | None = None, ranks: Ranks | None = None
    ) -> Iterator[Session]:
        for name, sessions in list(self.by_name.items()):
            if actor_name is None or name == actor_name:
                for rank, session in list(sessions.items()):
                    if selects(ranks, rank, session.start.coords):
                        yield session

    def info(self) -> list[DebugSessionInfo]:
        return sorted((s.info() for s in self.select()), key=lambda i: (i.actor_name, i.rank))

    def __len__(self) -> int:
        return sum(len(ranks) for ranks in self.by_name.values())


sessions = Sessions()
"""This process's sessions (the root client's; empty elsewhere)."""


async def serve_session(conn: Connection) -> None:
    """The ``debug`` service: a proc's breakpoints, one session at a time."""
    session: Session | None = None
    try:
        while True:
            frame = await conn.receive()
            message = decode_debug(frame[0])
            if isinstance(message, DebugSource):  # at any time, before a session too
                lines = linecache.getlines(message.filename)
                await conn.send([encode_body(DebugLines(message.filename, lines))])
            elif isinstance(message, DebugStart):
                if session is not None:
                    sessions.remove(session)
                session = Session(message, conn)
                sessions.add(session)
            elif session is None:
                log.warning("debugger: %s before any session; closing", type(message).__name__)
                return
            elif isinstance(message, DebugWrite):
                session.wrote(message)
            elif isinstance(message, DebugRead):
                session.reading = True
                session.changed.set()
            elif isinstance(message, DebugEnd):
                sessions.remove(session)
                session = None
    except TransportError:
        pass  # the proc went away: its session is over
    except (msgspec.DecodeError, msgspec.ValidationError, IndexError) as exc:
        log.warning("debugger: malformed session message, closing: %s", exc)
    finally:
        if session is not None:
            sessions.remove(session)
