"""A host agent's zygote: a process that has imported what a proc runs and forks procs.

A proc started as ``python -m monarch.core._host._proc`` spends ~0.25 s of CPU before its first
reply, most of it importing (asyncio, the transport, the core); procs started together
compete for the machine's CPUs doing the same work. The zygote imports it once; each proc
is then a ``fork`` of it (a few ms), which takes its environment, directory and standard
streams from the request (the agent's, as ``Popen`` would give them), re-reads its
configuration, and serves as any proc does (``_zygote_proc``). What the spawner asks its
procs to find imported (torch) the zygote does not import before it forks: a successor
zygote imports it meanwhile and forks the procs asked for after (``_zygote_proc``).

The agent starts its zygote (``python -m monarch.core._host._zygote_proc``) on first use, with a
``SOCK_SEQPACKET`` socket pair (a script's, as it imports ``monarch.actor``: see
``monarch._zygote_start``); ``monarch worker`` forks it instead, first thing, while it
has imported the core and holds no thread yet (``fork_zygote``: no interpreter to start,
ready before the worker listens). Either way: requests go one way with three descriptors
each, answers and exits come back, read by one thread here. Procs are the zygote's children:
it reaps them and reports each exit; each dies with it (``PR_SET_PDEATHSIG``), as it dies
with the agent. A proc that the zygote cannot serve (another program or Python, numactl, a
zygote that died or failed to start) is started with ``Popen`` as before; so is every proc
when ``fork_procs`` is off.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Final

from monarch._zygote_start import launch, prestarted, take
from monarch.core._placement import unpin_this_thread
from monarch.core._runtime._messages import (
    ZygoteExited,
    ZygoteFork,
    ZygoteForked,
    ZygoteMessage,
    decode_zygote,
    encode_body,
)

log = logging.getLogger("monarch.core")

MAX_MESSAGE: Final = 1 << 20
"""A request's size limit (an environment of a proc)."""


def _call(callback: Callable[[int], None], code: int) -> None:
    """An exit callback, on the zygote's reader thread: its failure is logged, never the
    end of the thread (every proc's answers and exits come through it)."""
    try:
        callback(code)
    except Exception:  # the reader serves every other proc
        log.exception("reporting a proc's exit failed")


class ForkedProc:
    """A proc the zygote forked, as ``subprocess.Popen`` shows one to the agent."""

    def __init__(self, pid: int, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._on_exit: list[Callable[[int], None]] = []

    def _exited(self, code: int) -> None:
        with self._lock:
            self.returncode = code
            self._ended.set()
            callbacks, self._on_exit = self._on_exit, []
        for callback in callbacks:
            _call(callback, code)

    def when_exited(self, callback: Callable[[int], None]) -> None:
        """Call ``callback`` with the exit code once the proc has exited (at once if it
        has; else on the thread that reads the zygote's answers): its agent then needs no
        thread per proc waiting for it (1,024 threads for a mesh of 1,024)."""
        with self._lock:
            code = self.returncode
            if code is None:
                self._on_exit.append(callback)
                return
        _call(callback, code)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"proc {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


Child = subprocess.Popen[bytes] | ForkedProc
"""A proc as its host agent holds it: started with ``Popen``, or forked by the zygote."""

Started = Callable[[ForkedProc | None, str], None]
"""Called (on the zygote's reader thread) with the forked proc, or None and why not."""


class Zygote:
    """This agent's zygote, started on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.process: subprocess.Popen[bytes] | _ForkedZygote | None = None
        self.failed = ""
        """Why the zygote cannot be used (empty while it can)."""
        self.tokens = 0
        self.waiting: dict[int, tuple[Started, IO[bytes] | None, IO[bytes] | None]] = {}
        self.procs: dict[int, ForkedProc] = {}
        self.early: dict[int, int] = {}
        """Exits heard before the fork's answer was handled."""
        self._outbox: queue.SimpleQueue[tuple[bytes, list[int]]] = queue.SimpleQueue()
        """Requests for ``_send``: message, and descriptors it closes once sent."""

    def usable(self) -> bool:
        return not self.failed

    def fork(
        self,
        env: dict[str, str],
        piped: bool,
        started: Started,
        main: tuple[str, ...] = (),
        outputs: tuple[int, int] | None = None,
    ) -> None:
        """Ask for a proc with ``env``; ``started`` hears the outcome. Its stdout and stderr
        are this process's (as a child's would be), or with ``piped`` pipes whose reading
        ends the proc object holds (log forwarding), or ``outputs`` (the caller's to close).
        With ``main``, the child runs that module (``ZygoteFork``), not a proc.

        It does not wait for the zygote: the request is sent in order by a thread of its
        own (``_send``), as the zygote makes room for it. The caller is the agent's event
        loop, which a spawn of 1,024 procs would otherwise block for as long as the zygote
        takes to fork them, while the procs forked first time out dialing it."""
        readers: tuple[IO[bytes] | None, IO[bytes] | None] = (None, None)
        opened: list[int] = []  # closed again if the process runs out of descriptors
        try:
            if piped:
                out_r, out_w = os.pipe()
                opened += (out_r, out_w)
                err_r, err_w = os.pipe()
                opened += (err_r, err_w)
                streams = [out_w, err_w]
            else:  # duplicates: the caller may close ``outputs`` before ``_send`` sends them
                streams = []
                for fd in outputs or (1, 2):
                    streams.append(os.dup(fd))
                    opened.append(streams[-1])
            devnull = os.open(os.devnull, os.O_RDONLY)
        except OSError:  # EMFILE: the caller reports that this proc cannot start
            for fd in opened:
                os.close(fd)
            raise
        if piped:
            readers = (os.fdopen(out_r, "rb", buffering=0), os.fdopen(err_r, "rb", buffering=0))
        try:
            with self.lock:
                self._started()
                self.tokens += 1
                token = self.tokens
                self.waiting[token] = (started, *readers)
                request = encode_body(ZygoteFork(token, env, os.getcwd(), main))
                self._outbox.put((request, [devnull, *streams]))
        except OSError as exc:
            for fd in (devnull, *streams):
                os.close(fd)
            for reader in readers:
                if reader is not None:
                    reader.close()
            self._broken(f"cannot reach the zygote: {exc}")
            started(None, self.failed)

    def _send(self, sock: socket.socket) -> None:
        """Send the requests in order (the zygote's thread of ``fork``), each once the
        zygote's side has room for it; then close what this process held of them."""
        unpin_this_thread()  # started where the loop may be pinned (``_placement``)
        while True:
            request, fds = self._outbox.get()
            try:
                socket.send_fds(sock, [request], fds)
            except OSError as exc:
                self._broken(f"cannot reach the zygote: {exc}")
            finally:
                for fd in fds:
                    os.close(fd)

    def _started(self) -> socket.socket:
        if self.failed:  # its socket may still be open: nobody would answer there
            raise OSError(self.failed)
        if self.sock is not None:
            return self.sock
        # The zygote started as the script imported monarch.actor, if there is one.
        self.process, self.sock = take() or launch()
        self._start_threads(self.sock)
        return self.sock

    def _start_threads(self, sock: socket.socket) -> None:
        """The reader of the zygote's answers and the sender of the requests."""
        threading.Thread(target=self._read, name="monarch-zygote", daemon=True).start()
        threading.Thread(
            target=self._send, args=(sock,), name="monarch-zygote-send", daemon=True
        ).start()

    def _read(self) -> None:
        unpin_this_thread()  # started where the loop may be pinned (``_placement``)
        sock = self.sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                self._broken("the zygote exited")
                return
            try:
                message: ZygoteMessage = decode_zygote(data)
            except Exception as exc:  # noqa: BLE001 - a broken zygote is not used again
                self._broken(f"the zygote sent a malformed message: {exc}")
                return
            self._handle(message)

    def _handle(self, message: ZygoteMessage) -> None:
        if isinstance(message, ZygoteForked):
            with self.lock:
                started, stdout, stderr = self.waiting.pop(message.token)
                proc = None
                if message.pid:
                    proc = self.procs[message.pid] = ForkedProc(message.pid, stdout, stderr)
                    code = self.early.pop(message.pid, None)
                    if code is not None:
                        del self.procs[message.pid]
                        proc._exited(code)
            if proc is None:
                for reader in (stdout, stderr):
                    if reader is not None:
                        reader.close()
            started(proc, message.error)
        elif isinstance(message, ZygoteExited):
            with self.lock:
                found = self.procs.pop(message.pid, None)
                if found is None:
                    self.early[message.pid] = message.code
            if found is not None:
                found._exited(message.code)

    def _broken(self, why: str) -> None:
        """The zygote is gone: its waiting requests fail, its procs count as killed (they
        die with it), and later procs are started without it."""
        with self.lock:
            if self.failed:
                return
            self.failed = why
            waiting, self.waiting = self.waiting, {}
            procs, self.procs = self.procs, {}
        if waiting:
            log.warning("proc zygote: %s; starting procs without it", why)
        for started, *readers in waiting.values():
            for reader in readers:
                if reader is not None:
                    reader.close()
            started(None, why)
        for proc in procs.values():
            proc._exited(-signal.SIGKILL)

    def stop(self) -> None:
        """End the zygote (its procs die with it)."""
        process = self.process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


class _ForkedZygote:
    """A zygote this process forked, as ``Popen`` shows a child to ``Zygote.stop``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = 0
        return self.returncode


zygote: Final = Zygote()
"""This process's zygote (a host agent's)."""


def fork_proc(env: dict[str, str], piped: bool, started: Started) -> None:
    """Start a proc through this process's zygote (see the module docstring); OSError
    where this process cannot open the descriptors the proc needs (its pipes)."""
    zygote.fork(env, piped, started)


def fork_program(
    main: tuple[str, ...], env: dict[str, str], outputs: tuple[int, int], started: Started
) -> None:
    """Have this process's zygote fork a child that runs module ``main[0]`` with arguments
    ``main[1:]``, as ``python -m`` would, with ``env`` and stdout and stderr ``outputs``
    (the caller's to close): a Python that has imported the core, without a Python's start
    (a script's zygote started as it imported monarch.actor is ready or nearly). The child
    is forked by the zygote itself, never by a successor (no preload), and does not die
    with the zygote; ``started`` hears the child or why there is none."""
    zygote.fork(env, False, started, main, outputs)


def cuda_initialized() -> bool:
    """Whether this process holds a CUDA context (the script used a GPU before importing
    monarch): a fork of it could never use CUDA, nor could the procs forked from that."""
    cuda = sys.modules.get("torch.cuda")
    return cuda is not None and bool(cuda.is_initialized())


def fork_zygote() -> socket.socket | None:
    """Fork this process's zygote now: in the child, its end of the socket pair (the child
    is to serve as the zygote, ``_zygote_proc.serve_forked``); None in this process, or
    where it cannot fork one (a thread runs already: a fork copies only the caller's; the
    zygote then starts as a program when first needed)."""
    if threading.active_count() != 1 or cuda_initialized():
        return None
    with zygote.lock:
        if zygote.sock is not None or zygote.failed:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            return theirs
        theirs.close()
        zygote.sock = ours
        zygote.process = _ForkedZygote(pid)
    zygote._start_threads(ours)
    return None


def prestart_zygote() -> None:
    """Start the zygote now (a worker, whose procs are to come), not at the first proc."""
    with zygote.lock:
        try:
            zygote._started()
        except OSError as exc:
            zygote.failed = f"cannot start: {exc}"


def zygote_usable() -> bool:
    return zygote.usable()


def zygote_started() -> bool:
    """Whether this agent's zygote was started (it may still be importing), here or as the
    script imported monarch.actor (``monarch._zygote_start``)."""
    return zygote.sock is not None or prestarted()


def stop_zygote() -> None:
    zygote.stop()
