"""The zygote process: ``python -m monarch.core._host._zygote_proc``, started by a host agent.

It imports what a proc runs, then forks one proc per request (see ``_zygote``): the child
takes the request's standard streams, directory and environment, re-reads configuration
from it, and serves as a proc; the zygote reaps its children and reports their exits. It
holds no thread and no event loop (a fork copies only the forking thread), and dies with
its agent.

What a request asks preloaded (``proc_preload``: torch, where the spawner imported it) is
not imported before the fork: importing torch takes ~1.5 s of CPU, which the first procs
would wait for, while most procs answer long before they touch a tensor (they import
torch themselves when they do, as unpickling one does). The zygote forks the proc at once
and forks a successor zygote that imports it; once that is done, the successor takes
every request (this zygote relays requests to it and its answers back), so the procs
asked for from then on find it imported without importing it. A successor is a zygote as
this one (it may have its own, for modules asked for later); the zygote is the subreaper
of its successor's procs, so that it reaps them and reports their exits if that
successor dies first. A successor whose import started a thread may not fork: it says so
and exits, and this zygote forks on without the module.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import os
import runpy
import select
import signal
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from monarch._zygote_start import FD_ENV, in_zygote
from monarch._zygote_start import PRELOAD_ENV as PRELOAD_AT_START_ENV
from monarch.core._config import KEYS, refresh_environment
from monarch.core._payload._memory import anonymous_memory, collapse_to_huge_pages
from monarch.core._runtime._internal_logs import forget_internal_logs, install_internal_logs
from monarch.core._runtime._messages import (
    ZygoteExited,
    ZygoteFork,
    ZygoteForked,
    ZygotePreload,
    ZygoteReady,
    decode_zygote,
    encode_body,
)

from ._bootstrap import import_proc_start, run_proc
from ._rehearsal import ROUNDS, rehearse_round
from ._spawning import die_with_parent, reap_orphans
from ._zygote import MAX_MESSAGE

_BASE_PATH = list(sys.path)


class Successor:
    """A zygote this one forked to import what requests asked preloaded (torch, say) while
    this one goes on forking procs without it; once ready, it takes every request, which
    this one relays to it, and this one relays its answers back."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.ready = False
        self.pending: set[int] = set()
        """Tokens of the requests relayed to it and not answered yet."""


class State:
    """What one zygote serves: its requester (the agent, or the zygote that forked it as
    its successor), the modules it has imported or handed to a successor, its procs."""

    def __init__(
        self, up: socket.socket, tried: set[str], first: Sequence[str] = (), rehearsals: int = 0
    ) -> None:
        self.up = up
        self.tried = tried
        """Preloads imported here or handed to the successor (each is tried once)."""
        self.first = list(first)
        """Preloads a successor starts on before any request asks for them (its starter's
        imports, ``monarch._zygote_start``)."""
        self.successor: Successor | None = None
        self.procs: set[int] = set()
        """Procs whose exit this zygote reports: its own, and its successor's (which it
        reaps itself if the successor dies first: this zygote is their subreaper)."""
        self.rehearsals = rehearsals
        """Rounds of a proc's start still to rehearse while idle (``_rehearsal``)."""
        self.heap: list[tuple[int, int]] | None = None
        """Pieces of its heap still to move onto huge pages once the rounds are done
        (``None``: not listed yet; see ``settle``)."""
        self.quiet_since = time.monotonic()
        """When the last request came (or this zygote started): it settles once idle
        for ``QUIET_BEFORE_REHEARSAL``."""


def serve(state: State, woken: int, wake: int) -> None:
    """Fork for each request until the requester closes its end; report each child's exit."""
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    if state.first:
        first, state.first = state.first, []
        start_successor(state, first)
    while True:
        successor = state.successor
        watched = [state.up.fileno(), woken]
        if successor is not None:
            watched.append(successor.sock.fileno())
        timeout = None  # while work is left, until the zygote has been quiet long enough
        if settling(state):
            timeout = max(0.0, state.quiet_since + QUIET_BEFORE_REHEARSAL - time.monotonic())
        try:
            ready, _, _ = select.select(watched, [], [], timeout)
        except InterruptedError:
            continue
        if not ready:
            settle(state)
            continue
        if successor is not None and successor.sock.fileno() in ready:
            # First: a proc the successor forked is known here before this zygote may
            # reap it (the successor dead, its procs come here), since the successor
            # said so before it died, and its procs die after it.
            relay(state, successor)
        if woken in ready:
            while True:
                try:
                    if not os.read(woken, 4096):
                        break
                except BlockingIOError:
                    break
            reap(state)
        if state.up.fileno() in ready:
            try:
                data, fds, _, _ = socket.recv_fds(state.up, MAX_MESSAGE, 3)
            except InterruptedError:
                continue
            if not data:
                return  # the requester is gone (its procs die with us)
            state.quiet_since = time.monotonic()
            answer(state, data, fds)
            if settling(state) and len(state.procs) >= REHEARSE_IN_BURST:
                settle(state)  # a large spawn: its later procs start warm


QUIET_BEFORE_REHEARSAL: Final = 0.5
"""Seconds without a request before the zygote settles (a step each time nothing waits
after that): a script's first spawn, and the calls and the stop right after it, do not
wait for a step (3-20 ms)."""

REHEARSE_IN_BURST: Final = 16
"""Procs forked before the steps left are taken between forks, not only while idle: a
spawn of 1,024 waits ~30 ms for the rounds and each later proc copies ~200 pages fewer."""

HEAP_PIECE: Final = 8 * 1024 * 1024
"""Bytes of its heap a zygote moves onto huge pages in one step (~20 ms here)."""


def settling(state: State) -> bool:
    """Whether the zygote still has a step of ``settle`` to take."""
    return bool(state.rehearsals) or state.heap is None or bool(state.heap)


def settle(state: State) -> None:
    """One step of what a zygote does once, while idle or between a burst's forks, to
    make its forks cheaper: a round of a proc's start (``_rehearsal``); after the last,
    what the rounds left freed and frozen as the zygote's imports were (``compact``);
    then its heap moved onto huge pages, a piece a step (``collapse_to_huge_pages``):
    a fork from the zygote that imported torch (~150 MiB) then copies ~2 ms less of
    page tables, and each such proc's exit tears down ~3 ms less."""
    if state.rehearsals:
        state.rehearsals = state.rehearsals - 1 if rehearse_round() else 0
        if not state.rehearsals:
            compact()
            gc.freeze()
    elif state.heap is None:
        state.heap = anonymous_memory(HEAP_PIECE)
    elif state.heap:
        collapse_to_huge_pages(*state.heap.pop())  # advice: where it cannot, no harm


def answer(state: State, data: bytes, fds: list[int]) -> None:
    try:
        request = decode_zygote(data)
        if isinstance(request, ZygotePreload) and not fds:  # came once this one was ready
            want_preloaded(state, request.names)
            return
        if not isinstance(request, ZygoteFork) or len(fds) != 3:
            raise ValueError(f"a fork request with 3 descriptors, not {type(request).__name__}")
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        state.up.send(encode_body(ZygoteForked(0, 0, f"bad request: {exc}")))
        return
    successor = state.successor
    ready = successor is not None and successor.ready and not request.main
    if ready and successor is not None and relayed(successor, request, data, fds):
        return  # a program (``main``) is forked here, without the preload
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        state.up.send(encode_body(ZygoteForked(request.token, 0, f"fork failed: {exc}")))
        return
    if pid == 0:
        raise Become(request, fds)  # out of the zygote's loop, to serve (see main)
    for fd in fds:
        os.close(fd)
    state.procs.add(pid)
    state.up.send(encode_body(ZygoteForked(request.token, pid)))
    # This proc runs without what it asked preloaded (it imports it if it needs it); a
    # successor imports it meanwhile, for the procs asked for once it is done.
    if not request.main:
        want_preloaded(state, preload_names(request.env.get(PRELOAD_ENV, "")))


def want_preloaded(state: State, names: Iterable[str]) -> None:
    """Have ``names`` imported for the procs to come: by a successor started for them, or
    by the one importing already (which adds them before it says it is ready)."""
    missing = [name for name in names if name not in state.tried and name not in sys.modules]
    if not missing:
        return
    successor = state.successor
    if successor is None:
        start_successor(state, missing)
    elif not successor.ready:  # (a ready one is relayed the requests that ask for them)
        state.tried.update(missing)
        with contextlib.suppress(OSError):  # it died: its exit comes through relay()
            successor.sock.send(encode_body(ZygotePreload(tuple(missing))))


def asked_meanwhile(state: State) -> list[str]:
    """What the zygote asked this successor to preload as well while it was importing
    (``ZygotePreload``: no other request comes before it says it is ready)."""
    names: list[str] = []
    while True:
        try:
            data = state.up.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
        except OSError:  # none waiting (BlockingIOError), or the zygote is gone
            return names
        message = decode_zygote(data) if data else None
        if not isinstance(message, ZygotePreload):
            return names
        names.extend(message.names)


def relayed(successor: Successor, request: ZygoteFork, data: bytes, fds: list[int]) -> bool:
    """Hand a request to the ready successor; False if it cannot take it any more."""
    try:
        socket.send_fds(successor.sock, [data], fds)
    except OSError:
        return False
    for fd in fds:
        os.close(fd)
    successor.pending.add(request.token)
    return True


def start_successor(state: State, names: list[str]) -> None:
    """Fork the zygote that imports ``names`` (see ``Successor``)."""
    state.tried.update(names)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        print(f"monarch zygote: cannot preload {names}: {exc}", file=sys.stderr, flush=True)
        return
    if pid == 0:
        ours.close()
        # What rounds are left it rehearses too (it has what the rounds so far warmed).
        raise BecomeSuccessor(
            State(theirs, set(state.tried), rehearsals=state.rehearsals), names, parent
        )
    theirs.close()
    state.successor = Successor(pid, ours)


def relay(state: State, successor: Successor) -> None:
    """The successor's messages, as many as have come."""
    while state.successor is successor:
        try:
            data = successor.sock.recv(MAX_MESSAGE, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        relay_one(state, successor, data)


def relay_one(state: State, successor: Successor, data: bytes) -> None:
    """A message of the successor (empty: it exited): its readiness, or an answer or an
    exit for the requester."""
    message = decode_zygote(data) if data else None
    if isinstance(message, ZygoteReady) and not message.error:
        successor.ready = True
        return
    if message is None or isinstance(message, ZygoteReady):
        # It exited, or cannot fork: what it was asked to fork is started without it (by
        # the agent), and this zygote forks on, without the preload.
        if message is not None:
            print(f"monarch zygote: {message.error}", file=sys.stderr, flush=True)
        state.successor = None
        successor.sock.close()
        for token in sorted(successor.pending):
            why = "the zygote that preloaded modules exited"
            state.up.send(encode_body(ZygoteForked(token, 0, why)))
        return
    if isinstance(message, ZygoteForked):
        successor.pending.discard(message.token)
        if message.pid:
            state.procs.add(message.pid)
    elif isinstance(message, ZygoteExited):
        if message.pid not in state.procs:
            return  # reaped here already (the successor died, this zygote reaped it)
        state.procs.discard(message.pid)
    state.up.send(data)


PRELOAD_ENV: Final = KEYS["proc_preload"].env[0]


def preload_names(names: str) -> list[str]:
    """The modules of a ``proc_preload`` list."""
    return [name for name in (part.strip() for part in names.split(",")) if name]


def preload(names: list[str]) -> str:
    """Import what the spawner asks its procs to find imported (``proc_preload``): every
    proc forked after that has it. A fork copies only the forking thread, so a module that
    starts a thread at import makes this zygote unsafe: it says why (it must not fork)."""
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - the proc imports it itself, or fails
            print(f"monarch zygote: cannot preload {name}: {exc!r}", file=sys.stderr, flush=True)
        threads = _threads()
        if threads > 1 and _threads_after_a_fork() > 1:
            return f"preloading {name} started {threads - 1} thread(s) in the zygote"
    return ""


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _threads_after_a_fork() -> int:
    """This process's threads once a fork has run its ``pthread_atfork`` handlers: a pool
    that stops itself before a fork (OpenBLAS's, which numpy starts at import, and torch
    imports numpy) is no danger to a fork and leaves none behind (it restarts at its next
    use, which a zygote never makes). A child that exits at once is the probe."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    with contextlib.suppress(ChildProcessError):  # reaped already (we may be a subreaper)
        os.waitpid(pid, 0)
    return _threads()


class BecomeSuccessor(BaseException):
    """Raised in a forked successor: it leaves its parent's loop and serves it (see main)."""

    def __init__(self, state: State, names: list[str], parent: int) -> None:
        super().__init__()
        self.state = state
        self.names = names
        self.parent = parent


class Become(BaseException):
    """Raised in a forked child: it leaves the zygote's loop and becomes a proc."""

    def __init__(self, request: ZygoteFork, fds: list[int]) -> None:
        super().__init__()
        self.request = request
        self.fds = fds


def become_proc(request: ZygoteFork, fds: list[int]) -> None:
    """In the child: what ``Popen`` and the interpreter's start would have set, then serve
    (as ``python -m monarch.core._host._proc`` would: an uncaught error, atexit, thread joins)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    changed = take_environment(request.env)
    extra = [p for p in request.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request.cwd, *extra, *(p for p in _BASE_PATH[1:] if p not in extra)]
    sys.argv[:] = [sys.argv[0]]
    if request.main:  # a program, as ``python -m`` runs it (its exit status is the child's)
        set_title(f"{sys.executable} -m {request.main[0]}")  # as ps would show that program
        forget_internal_logs()  # the zygote's, which the program may close under it
        sys.argv[:] = list(request.main)
        runpy.run_module(request.main[0], run_name="__main__", alter_sys=True)
        return
    refresh_environment(changed)  # the zygote's layers, but for what the request changed
    # The modules the zygote had are the ones it counted before it forked (counting them
    # here would write to a page of each of their names: ~170 page copies, ~0.5 ms).
    counted = _imported[0] if _imported and len(_imported[0]) == len(sys.modules) else None
    run_proc(counted)


def take_environment(env: dict[str, str]) -> list[str]:
    """Make this process's environment ``env``, changing only the variables that differ
    (returned): most are the zygote's already (the agent's), and each ``putenv``/``unsetenv``
    writes to pages of the C heap and environment the child shares with the zygote (a clear
    and a full update cost a proc ~250 page copies, ~1.2 ms of its start)."""
    current = os.environ
    changed = [name for name in current if name not in env]
    for name in changed:
        del current[name]
    for name, value in env.items():
        if current.get(name) != value:
            current[name] = value
            changed.append(name)
    return changed


def reap(state: State) -> None:
    """Report the exits of this zygote's procs (not of its successors, nor of what procs
    left behind: orphans come here, to the subreaper)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in state.procs:
            state.procs.discard(pid)
            state.up.send(encode_body(ZygoteExited(pid, os.waitstatus_to_exitcode(status))))


TITLE: Final = "python -m monarch.core._host._zygote_proc"


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


def compact() -> None:
    """Free what the imports left behind before the first fork: the cycles the collector
    (off while importing) did not collect, then the heap's free pages (``malloc_trim``).
    Every proc's RSS counts each page of the zygote it maps: ~1.2 MiB a proc less."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


_imported: list[frozenset[str]] = []
"""The modules this zygote has imported, counted once (``run_proc``'s ``started_with``)."""


def count_imported() -> None:
    _imported[:] = [frozenset(sys.modules)]


def serve_zygote(sock: socket.socket) -> None:
    """Serve as the zygote on ``sock``; returns in a proc once it is done, or when the
    agent is gone."""
    die_with_parent()
    if os.getppid() == 1:
        sys.exit("monarch zygote: its agent is already gone")
    in_zygote()  # a preload that imports monarch.actor starts no zygote here (a chain)
    install_internal_logs("zygote")  # its procs take the handler and file (see there)
    import_proc_start()  # once here, not in every proc
    compact()
    count_imported()
    gc.freeze()  # what the zygote imported: never scanned again, here or in its procs
    gc.enable()  # off since the core's import (see __init__)
    first = preload_names(os.environ.pop(PRELOAD_AT_START_ENV, ""))
    state = State(sock, set(), first, rehearsals=ROUNDS)
    while True:
        # The procs a successor forked are reaped (and their exits reported) here if
        # that successor dies first.
        reap_orphans()
        woken, wake = os.pipe()
        try:
            serve(state, woken, wake)
            return
        except Become as child:
            request, fds = child.request, child.fds
            break
        except BecomeSuccessor as successor:
            signal.set_wakeup_fd(-1)
            state.up.close()  # the parent's requester is the parent's alone
            state, names, parent = successor.state, successor.names, successor.parent
        except (BrokenPipeError, ConnectionError):
            return  # the requester is gone
        # A successor: it preloads, says whether it can fork, and serves its parent.
        die_with_parent()
        os.close(woken)
        os.close(wake)
        if os.getppid() != parent:
            os._exit(0)
        unsafe = preload(names)
        while not unsafe and (more := asked_meanwhile(state)):
            state.tried.update(more)  # each tried once, here too (one that fails stays out)
            unsafe = preload(more)
        try:
            state.up.send(encode_body(ZygoteReady(unsafe)))
        except OSError:
            os._exit(0)
        if unsafe:
            os._exit(0)
        count_imported()
        gc.freeze()  # what it preloaded, as the zygote's own imports above
    # A fork: out of the handler, so that no error of the proc has Become as its context.
    state.up.close()
    if state.successor is not None:
        state.successor.sock.close()
    os.close(woken)
    os.close(wake)
    become_proc(request, fds)


if __name__ == "__main__":
    main()
