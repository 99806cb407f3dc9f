"""The debugger console: where ``monarch debug`` (or ``nc`` and the token) talks to the
root client's sessions.

It listens on upstream's ``MONARCH_DEBUG_SERVER_HOST``:``MONARCH_DEBUG_SERVER_PORT``
(``localhost``:27000; another free port, logged, when that one is taken), from the first
breakpoint of the job on. A connection's first line must be the token (``_debug_client``);
then it gets upstream's ``monarch_dbg>`` prompt. One console at a time: a new one
replaces the last, as upstream's does.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import hmac
import logging
import os
import secrets
import sys
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

from monarch.core._command._debug_client import server_host, server_port, token_file
from monarch.core._runtime import Runtime
from monarch.transport import Connection

from ._commands import HELP, Attach, Cast, Continue, ListSessions, Quit, parse
from ._sessions import SERVICE_NAME, DebugSessionInfo, Session, serve_session, sessions

log = logging.getLogger("monarch.debugger")

BANNER = (
    "\n\n************************ MONARCH DEBUGGER ************************\n"
    "Enter 'help' for a list of commands.\n"
    "Enter 'list' to show all active breakpoints.\n\n"
)
PROMPT = "monarch_dbg> "
PDB_PROMPT = "(Pdb) "
"""What pdb writes when it waits for a line: not part of a command's answer."""


class ConsoleClosed(Exception):
    """The terminal went away."""


class Console:
    """The listening console of this (root) process."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.server: asyncio.Server | None = None
        self.starting: asyncio.Future[None] | None = None
        self.port = 0
        self.token_path: Path | None = None
        self.current: asyncio.Task[None] | None = None
        self.announced = False

    async def start(self) -> None:
        """Listen, once (sessions that arrive together wait for the first)."""
        if self.starting is None:
            self.starting = asyncio.ensure_future(self._listen())
        await asyncio.shield(self.starting)

    async def _listen(self) -> None:
        host, port = server_host(), server_port()
        try:
            self.server = await asyncio.start_server(self._serve, host, port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            self.server = await asyncio.start_server(self._serve, host, 0)
            log.warning("debugger: port %d is taken; the console listens on another", port)
        self.port = self.server.sockets[0].getsockname()[1]
        self.token_path = token_file(self.port)
        self.token_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.token + "\n")
        atexit.register(self._forget_token)  # nothing closes the console: the client ends

    def announce(self, session: Session) -> None:
        """Tell the user, once, that a breakpoint waits and how to get to it."""
        if self.announced:
            return
        self.announced = True
        hint = "monarch debug"
        if self.port != server_port():
            hint += f" --port {self.port}"
        print(
            f"Monarch debugger: {session.actor_name} rank {session.rank} stopped at a breakpoint; "
            f"run `{hint}` to attach",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self._forget_token()

    def _forget_token(self) -> None:
        if self.token_path is not None:
            with suppress(OSError):
                self.token_path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.readline(), 30)
        except (TimeoutError, OSError, ValueError):
            writer.close()
            return
        if not hmac.compare_digest(first.strip(), self.token.encode()):
            writer.write(b"refused: wrong token (monarch debug reads it from the token file)\n")
            with suppress(OSError):
                await writer.drain()
            writer.close()
            return
        if self.current is not None:
            self.current.cancel()
            with suppress(asyncio.CancelledError, ConsoleClosed):
                await self.current
        task = asyncio.current_task()
        self.current = task
        try:
            await _Terminal(reader, writer).run()
        except (ConsoleClosed, asyncio.CancelledError):
            pass
        finally:
            if self.current is task:
                self.current = None
            writer.close()


class _Terminal:
    """One attached terminal: upstream's command loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def output(self, text: str) -> None:
        try:
            self.writer.write(text.encode())
            await self.writer.drain()
        except OSError as exc:
            raise ConsoleClosed from exc

    async def input(self, prompt: str = "") -> str:
        if prompt:
            await self.output(prompt)
        line = await self.reader.readline()
        if not line.endswith(b"\n"):
            raise ConsoleClosed
        return line.decode(errors="replace").rstrip("\r\n")

    async def run(self) -> None:
        await self.output(BANNER)
        while True:
            line = await self.input(PROMPT)
            if not line.strip():
                continue
            try:
                command = parse(line)
            except ValueError as exc:
                await self.output(f"Error parsing input: {exc}\n")
                continue
            try:
                if isinstance(command, Quit):
                    await self.output("Quitting debug session...\n")
                    return
                if isinstance(command, ListSessions):
                    await self.output(table(sessions.info()))
                elif isinstance(command, Attach):
                    await self.attach(sessions.get(command.actor_name, command.rank))
                elif isinstance(command, Cast):
                    chosen = sessions.select(command.actor_name, command.ranks)
                    await self.cast_and_show(command.command, chosen)
                elif isinstance(command, Continue):
                    await cast("clear", sessions.select())
                    await cast("c", sessions.select())
                else:
                    await self.output(HELP)
            except ValueError as exc:
                await self.output(f"Error processing command: {exc}\n")

    async def cast_and_show(self, line: str, selected: Iterable[Session]) -> None:
        """``cast``: ``line`` to each selected session, then what each printed, a line at a
        time prefixed with its actor and rank (upstream's cast prints nothing; the output
        also stays for whoever attaches)."""
        chosen = list(selected)

        async def one(session: Session) -> str:
            if not await session.next_line_wanted():
                return ""
            await session.send_line(line)
            await session.next_line_wanted()  # its answer is whole once it asks again
            session.unseen.clear()
            return "".join(session.backlog)

        outputs = await asyncio.gather(*(one(session) for session in chosen))
        for session, text in zip(chosen, outputs, strict=True):
            text = text.removesuffix(PDB_PROMPT)
            where = f"[{session.actor_name} {session.rank}] "
            await self.output("".join(f"{where}{shown}\n" for shown in text.splitlines()))

    async def attach(self, session: Session) -> None:
        """Relay the session's pdb until the user says ``detach`` or the actor runs on."""
        where = f"{session.actor_name} {session.rank} ({session.start.hostname})"
        await self.output(f"Attached to debug session for {where}\n")
        if session.backlog:
            shown = f"{session.actor_name} {session.rank}"
            await self.output(f"<last pdb output for {shown} follows>\n")
            await self.output("".join(session.backlog))
        session.unseen.clear()
        while True:
            wanted = await session.next_line_wanted()
            if session.unseen:
                shown, session.unseen[:] = "".join(session.unseen), []
                await self.output(shown)
            if not wanted:
                break
            line = await self.input()
            if line.strip() == "detach":
                break
            await session.send_line(line)
            await asyncio.sleep(0)
        await self.output(f"Detached from debug session for {where}\n")


async def cast(line: str, selected: Iterable[Session]) -> None:
    """Send ``line`` to each selected session once its pdb asks for one."""
    chosen = list(selected)

    async def one(session: Session) -> None:
        if await session.next_line_wanted():
            await session.send_line(line)

    await asyncio.gather(*(one(session) for session in chosen))


def table(infos: list[DebugSessionInfo]) -> str:
    """``list``'s grid, as upstream's (tabulate's ``grid``)."""
    headers = ["Actor Name", "Rank", "Coords", "Hostname", "Function", "Line No."]
    rows = [
        [i.actor_name, str(i.rank), str(i.coords), i.hostname, str(i.function), str(i.lineno)]
        for i in infos
    ]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=False)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+\n"
    head = "+" + "+".join("=" * (w + 2) for w in widths) + "+\n"

    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |\n"

    body = "".join(row(r) + rule for r in rows) or rule
    return rule + row(headers) + head + body


console = Console()
"""This process's console (started by the first session of the root client)."""


def install_console(runtime: Runtime) -> None:
    """Offer the ``debug`` service on the root client's listener: the first session starts
    the console."""

    async def serve(conn: Connection) -> None:
        await console.start()
        sessions.on_start = console.announce
        await serve_session(conn)

    runtime.services[SERVICE_NAME] = serve
