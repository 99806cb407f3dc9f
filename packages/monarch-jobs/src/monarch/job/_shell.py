"""``shell(host_mesh_singleton)`` (upstream's ``monarch.job.shell``): an interactive
shell on one host of a mesh, over a pseudo-terminal.

A proc on that host starts ``$SHELL -i`` (``/bin/bash`` by default) in a session of its own
whose controlling terminal is a PTY; the client puts its own terminal in raw mode and the
two copy bytes both ways over a pair of ports. The shell sees a real terminal (job
control, line editing, full-screen programs, window size changes); end of input on the
client (a pipe closed) hangs up the remote session, as closing a terminal does; the
remote shell's exit status is returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import sys
import termios
import tty
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeAlias

from monarch.actor import Actor, Channel, HostMesh, Port, PortReceiver, current_rank, endpoint

CHUNK = 16 * 1024
_GRACE = 1.0
"""Seconds a hung-up session gets to end before SIGTERM, then as long before SIGKILL."""


class _Keys(NamedTuple):
    data: bytes


class _Resize(NamedTuple):
    rows: int
    columns: int


class _HangUp(NamedTuple):
    pass


class _Screen(NamedTuple):
    data: bytes


class _Exited(NamedTuple):
    status: int


class _Failed(NamedTuple):
    error: str


_In: TypeAlias = _Keys | _Resize | _HangUp
_Out: TypeAlias = _Screen | _Exited | _Failed


def _set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def _size_of(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


def exit_status(returncode: int) -> int:
    """A shell's view of a child's end: its code, or 128 + the signal that ended it."""
    return returncode if returncode >= 0 else min(128 - returncode, 255)


async def _ready(fd: int, write: bool) -> None:
    """Until ``fd`` can be read (or written) without blocking."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def fire() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, fire)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def read_some(fd: int) -> bytes:
    """The next bytes of a non-blocking ``fd``; ``b""`` at its end (a PTY whose other side
    every process closed says so with EIO)."""
    while True:
        try:
            return os.read(fd, CHUNK)
        except BlockingIOError:
            await _ready(fd, write=False)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""
            raise


async def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to a non-blocking ``fd``, waiting while it is full."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            await _ready(fd, write=True)


@contextlib.contextmanager
def _nonblocking(*fds: int) -> Iterator[None]:
    before = [os.get_blocking(fd) for fd in fds]
    for fd in fds:
        os.set_blocking(fd, False)
    try:
        yield
    finally:
        for fd, blocking in zip(fds, before, strict=True):
            with contextlib.suppress(OSError):
                os.set_blocking(fd, blocking)


def _rank_env() -> dict[str, str]:
    point = current_rank()
    env = {f"MONARCH_RANK_{dim.upper()}": str(value) for dim, value in dict(point).items()}
    for dim, size in zip(point.extent.labels, point.extent.sizes, strict=True):
        env[f"MONARCH_SIZE_{dim.upper()}"] = str(size)
    return env


class _Session(Actor):
    """The remote end: the shell on a PTY, its screen sent to ``output``."""

    def __init__(self) -> None:
        self._process: asyncio.subprocess.Process | None = None
        self._master = -1
        self._task: asyncio.Task[None] | None = None

    @endpoint
    async def start(
        self,
        output: Port[_Out],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        term: str,
        size: tuple[int, int],
    ) -> Port[_In]:
        if self._process is not None:
            raise RuntimeError("this session runs a shell already")
        keys, inbox = Channel[_In].open()
        child_env = {**os.environ, **_rank_env(), **(env or {}), "TERM": term}
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)  # noqa: ASYNC240
        master, slave = os.openpty()
        try:
            _set_size(master, *size)
            # setsid --ctty: a session of its own whose controlling terminal is the PTY
            self._process = await asyncio.create_subprocess_exec(
                "setsid",
                "--ctty",
                child_env.get("SHELL", "/bin/bash"),
                "-i",
                stdin=slave,
                stdout=slave,
                stderr=slave,
                cwd=cwd,
                env=child_env,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        self._master = master
        self._task = asyncio.ensure_future(self._run(self._process, inbox, output))
        return keys

    async def _run(
        self, process: asyncio.subprocess.Process, inbox: PortReceiver[_In], output: Port[_Out]
    ) -> None:
        screen = asyncio.ensure_future(self._screen(process, output))
        keys = asyncio.ensure_future(self._keys(process, inbox))
        try:
            done, _ = await asyncio.wait((screen, keys), return_when=asyncio.FIRST_COMPLETED)
            if keys in done:
                keys.result()  # a hang-up: the screen ends as the session does
            await screen
        except Exception as exc:  # noqa: BLE001 - the client is told, the shell ended
            with contextlib.suppress(Exception):
                output.send(_Failed(f"{type(exc).__name__}: {exc}"))
            await self._end(process)
        finally:
            for task in (screen, keys):
                task.cancel()
            await asyncio.gather(screen, keys, return_exceptions=True)

    async def _screen(self, process: asyncio.subprocess.Process, output: Port[_Out]) -> None:
        while data := await read_some(self._master):
            output.send(_Screen(data))
        output.send(_Exited(exit_status(await process.wait())))

    async def _keys(self, process: asyncio.subprocess.Process, inbox: PortReceiver[_In]) -> None:
        while process.returncode is None:
            message = await inbox.recv()
            if isinstance(message, _Keys):
                await write_all(self._master, message.data)
            elif isinstance(message, _Resize):
                _set_size(self._master, message.rows, message.columns)
            else:
                await self._end(process)
                return

    async def _end(self, process: asyncio.subprocess.Process) -> None:
        """Hang up the session (SIGHUP to the shell and the terminal's foreground group);
        what is left after the grace gets SIGTERM, then SIGKILL."""
        groups = {process.pid}
        with contextlib.suppress(OSError):
            groups.add(os.tcgetpgrp(self._master))
        groups -= {os.getpgrp(), 0, 1}
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGKILL):
            for group in groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, sig)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), _GRACE)
            groups = {group for group in groups if _group_alive(group)}
            if process.returncode is not None and not groups:
                return
        await process.wait()

    async def __cleanup__(self, exc: Exception | None) -> None:
        if self._process is not None and self._process.returncode is None:
            await self._end(self._process)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The client's terminal in raw mode (keys go through as typed), restored after."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _on_resize(notify: Callable[[], None]) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGWINCH, notify)
    except (RuntimeError, ValueError):  # not the main thread
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGWINCH)


async def _terminal(keys: Port[_In], screen: PortReceiver[_Out], stdin: int, stdout: int) -> int:
    """Copy the client's terminal to the session and back until the shell exits."""

    async def typed() -> None:
        try:
            while data := await read_some(stdin):
                keys.send(_Keys(data))
        finally:
            with contextlib.suppress(Exception):
                keys.send(_HangUp())

    async def shown() -> int:
        while True:
            message = await screen.recv()
            if isinstance(message, _Screen):
                await write_all(stdout, message.data)
            elif isinstance(message, _Exited):
                return message.status
            else:
                raise RuntimeError(f"the remote shell failed: {message.error}")

    with (
        _raw(stdin),
        _nonblocking(stdin, stdout),
        _on_resize(lambda: keys.send(_Resize(*_size_of(stdin)))),
    ):
        reading = asyncio.ensure_future(typed())
        showing = asyncio.ensure_future(shown())
        try:
            done, _ = await asyncio.wait((reading, showing), return_when=asyncio.FIRST_COMPLETED)
            if reading in done:
                reading.result()  # the end of input hung up; the status still comes
            return await showing
        finally:
            for task in (reading, showing):
                task.cancel()
            await asyncio.gather(reading, showing, return_exceptions=True)


async def _shell(mesh: HostMesh, env: dict[str, str] | None, workdir: str | None) -> int:
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout.flush()
    output, screen = Channel[_Out].open()
    procs = mesh.spawn_procs()
    try:
        session = procs.spawn("shell", _Session)
        keys: Port[_In] = await session.start.call_one(
            output,
            env,
            workdir,
            os.getcwd(),
            os.environ.get("TERM", "xterm-256color"),
            _size_of(stdin),
        )
        return await _terminal(keys, screen, stdin, stdout)
    finally:
        await procs.stop()


def shell(
    host_mesh_singleton: HostMesh,
    *,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
) -> int:
    """Run an interactive shell on the one host of ``host_mesh_singleton`` (slice a mesh to
    one host first) on this process's terminal; return its exit status. ``env`` adds to
    the shell's environment (which has ``MONARCH_RANK_*``/``MONARCH_SIZE_*``);
    ``workdir`` is where it starts (default: this process's working directory, where it
    exists on that host)."""
    if host_mesh_singleton.size() != 1:
        raise ValueError(
            "shell requires a singleton HostMesh; slice the mesh to one host first "
            f"(this one has {host_mesh_singleton.size()} hosts)"
        )
    return asyncio.run(_shell(host_mesh_singleton, env, workdir))


__all__ = ["shell"]
