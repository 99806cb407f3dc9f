"""The zygote process: ``python -m monarch.core._zygote_proc``, started by a host agent.

It imports what a proc runs, then forks one proc per request (see ``_zygote``): the child
takes the request's standard streams, directory and environment, re-reads configuration
from it, and serves as a proc; the zygote reaps its children and reports their exits. It
holds no thread and no event loop (a fork copies only the forking thread), and dies with
its agent.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import select
import signal
import socket
import sys
from typing import Final

import msgspec

from ._bootstrap import die_with_parent, import_proc_start, run_proc
from ._config import KEYS, reload_from_environment
from ._messages import ZygoteExited, ZygoteFork, ZygoteForked, decode_zygote, encode_body
from ._zygote import FD_ENV, MAX_MESSAGE

_BASE_PATH = list(sys.path)


def serve(sock: socket.socket, woken: int, wake: int) -> None:
    """Fork for each request until the agent closes its end; report each child's exit."""
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    while True:
        try:
            ready, _, _ = select.select([sock.fileno(), woken], [], [])
        except InterruptedError:
            continue
        if woken in ready:
            while True:
                try:
                    if not os.read(woken, 4096):
                        break
                except BlockingIOError:
                    break
            reap(sock)
        if sock.fileno() in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 3)
            except InterruptedError:
                continue
            if not data:
                return  # the agent is gone (its procs die with us)
            answer(sock, data, fds)


def answer(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    try:
        request = decode_zygote(data)
        if not isinstance(request, ZygoteFork) or len(fds) != 3:
            raise ValueError(f"a fork request with 3 descriptors, not {type(request).__name__}")
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        sock.send(encode_body(ZygoteForked(0, 0, f"bad request: {exc}")))
        return
    if not _unsafe:
        preload(request.env.get(PRELOAD_ENV, ""))
    if _unsafe:
        for fd in fds:
            os.close(fd)
        sock.send(encode_body(ZygoteForked(request.token, 0, _unsafe[0])))
        return
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        sock.send(encode_body(ZygoteForked(request.token, 0, f"fork failed: {exc}")))
        return
    if pid == 0:
        raise Become(request, fds)  # out of the zygote's loop, to serve (see main)
    for fd in fds:
        os.close(fd)
    sock.send(encode_body(ZygoteForked(request.token, pid)))


PRELOAD_ENV: Final = KEYS["proc_preload"].env[0]
_tried: set[str] = set()
_unsafe: list[str] = []
"""Why this zygote may not fork any more (a preloaded module started a thread)."""


def preload(names: str) -> None:
    """Import what the spawner asks its procs to find imported (``proc_preload``), once
    each: every proc forked after that has it. A fork copies only the forking thread, so a
    module that starts a thread at import makes the zygote unsafe: it forks no more (its
    agent starts procs as new Pythons)."""
    for name in filter(None, (part.strip() for part in names.split(","))):
        if name in _tried or name in sys.modules:
            continue
        _tried.add(name)
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - the proc imports it itself, or fails
            print(f"monarch zygote: cannot preload {name}: {exc!r}", file=sys.stderr, flush=True)
        threads = len(os.listdir("/proc/self/task"))
        if threads > 1:
            _unsafe.append(f"preloading {name} started {threads - 1} thread(s) in the zygote")
            return


class Become(BaseException):
    """Raised in a forked child: it leaves the zygote's loop and becomes a proc."""

    def __init__(self, request: ZygoteFork, fds: list[int]) -> None:
        super().__init__()
        self.request = request
        self.fds = fds


def become_proc(request: ZygoteFork, fds: list[int]) -> None:
    """In the child: what ``Popen`` and the interpreter's start would have set, then serve
    (as ``python -m monarch.core._proc`` would: an uncaught error, atexit, thread joins)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    extra = [p for p in request.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request.cwd, *extra, *(p for p in _BASE_PATH[1:] if p not in extra)]
    sys.argv[:] = [sys.argv[0]]
    reload_from_environment()
    run_proc()


def reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(encode_body(ZygoteExited(pid, os.waitstatus_to_exitcode(status))))


TITLE: Final = "python -m monarch.core._zygote_proc"


def main() -> None:
    serve_zygote(socket.socket(fileno=int(os.environ.pop(FD_ENV))))


def serve_forked(sock: socket.socket) -> None:
    """Serve as the zygote forked by ``monarch worker`` (``_zygote.fork_zygote``): with
    the command line a started zygote has, which its procs keep (else ``ps`` would show
    the zygote and every proc as one more ``monarch worker``)."""
    set_title(TITLE)
    serve_zygote(sock)


def set_title(title: str) -> None:
    """Overwrite this process's command line (``/proc/self/cmdline``, what ``ps`` shows)
    with ``title``, cut to the length of the original (Linux: the kernel reads it from the
    memory of the original arguments, which Python copied at start and never reads again)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            text = stat.read()
        fields = text[text.rindex(b")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end (since 3.5)
    except (OSError, ValueError, IndexError):
        return
    size = end - start
    if size <= 1:
        return
    data = title.encode()[: size - 1]
    ctypes.memmove(start, data + bytes(size - len(data)), size)


def serve_zygote(sock: socket.socket) -> None:
    """Serve as the zygote on ``sock``; returns in a proc once it is done, or when the
    agent is gone."""
    die_with_parent()
    if os.getppid() == 1:
        sys.exit("monarch zygote: its agent is already gone")
    import_proc_start()  # once here, not in every proc
    gc.freeze()  # what the zygote imported: never scanned again, here or in its procs
    gc.enable()  # off since the core's import (see __init__)
    woken, wake = os.pipe()
    try:
        serve(sock, woken, wake)
        return
    except Become as child:
        request, fds = child.request, child.fds
    except (BrokenPipeError, ConnectionError):
        return  # the agent is gone
    # A fork: out of the handler, so that no error of the proc has Become as its context.
    sock.close()
    os.close(woken)
    os.close(wake)
    become_proc(request, fds)


if __name__ == "__main__":
    main()
