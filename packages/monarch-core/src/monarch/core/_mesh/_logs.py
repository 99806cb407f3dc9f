"""Procs' output at their spawner: upstream's log forwarding, as its users see it.

With ``configure(enable_log_forwarding=True)`` when procs are spawned, their host agent
reads each proc's stdout and stderr from pipes (as the parent, it reads to the end: the
last lines of a proc that crashed, its traceback included, are not lost), passes the bytes
on to its own stdout and stderr (on the client's host these are the client's, as without
forwarding), and sends whole lines to the spawner (``LogLines``), before it reports the
proc's exit. It reads every proc's pipes on one thread (``_runtime._fd_watch``, which also
hears the exits), not a thread per pipe: a mesh of 1,024 would hold 2,048 of them. The
spawner's ``LogSink`` of that proc mesh drops them until
``logging_option(stream_to_client=True)``; then prints each line with where it came from,
or, with an ``aggregate_window_sec``, once per window, similar lines of all ranks together
as one line with their count (a 64-rank mesh printing one line gives one line).

Printing is done by a thread of its own, the agent's passing on too: a client whose stdout
is a pipe nobody drains must not stall the runtime's loop, nor the thread that reads the
pipes and hears the exits (an exit is reported once its proc's lines are printed, or
``PRINT_GRACE`` s after). The agent passes output on whole lines at a time (a
partial line waits for its end), as the spawner prints: on a client that is its own agent
both write to one stream, and a line of one must not land inside a line of the other (a
crash's traceback comes in pieces).

Upstream's two other uses of the pipes, also the agent's: ``tail_log_lines`` keeps the last
lines each proc wrote to stderr, which the spawner's error names when a proc exits before
it was ready; ``enable_file_capture`` (with ``force_file_log``, as upstream's on a machine
outside Meta's clusters) appends every line of the agent's procs, ``[rank] line``, to two
files of the host, ``/tmp/$USER/monarch_log_HOST_ID.stdout`` and ``.stderr``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import queue
import secrets
import socket
import sys
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Protocol, TextIO

from monarch.core._payload._per_process import PerProcess
from monarch.core._placement import unpin_this_thread
from monarch.core._runtime import Runtime
from monarch.core._runtime._fd_watch import fd_watch
from monarch.core._runtime._internal_logs import log_dir
from monarch.core._runtime._messages import LogLines, PortRef, SetLogLevel
from monarch.transport import Buffer

READ_SIZE: Final = 65536
LONGEST_LINE: Final = 65536
"""Bytes of a line without a newline after which it is sent as it is."""
DRAIN_AFTER_EXIT: Final = 2.0
"""Seconds an agent reads a proc's pipes after it exited (a child of the proc may hold
them open)."""
PRINT_GRACE: Final = 1.0
"""Seconds a proc's exit report waits for the agent's printer to have passed its last
lines on (a stream nobody drains may hold the printer)."""
SIMILARITY: Final = 0.15
"""Lines differing in at most this fraction of their length (edits) are similar."""
MOST_GROUPS: Final = 256
"""Groups of similar lines one window compares a line against (then: a new group)."""
CYAN: Final = "\x1b[36m"
YELLOW: Final = "\x1b[33m"
RESET: Final = "\x1b[0m"

_HOST: Final = socket.gethostname()


# -- the agent: reading a proc's output --------------------------------------------------------


class Piped(Protocol):
    """A child whose output comes through pipes (``Popen``, or a proc the zygote forked)."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None


@dataclass(frozen=True)
class OutputPlan:
    """What an agent does with the output of the procs of one spawn, read from pipes."""

    forward: bool
    """Send whole lines to the spawner (``enable_log_forwarding``)."""
    capture: bool
    """Append them to the host's files (``enable_file_capture`` and ``force_file_log``)."""
    tail: int
    """Keep the last ones of stderr (``tail_log_lines``)."""
    prefix: bool = True
    """Start each captured line with ``[rank]`` (``prefix_with_rank``)."""

    @property
    def piped(self) -> bool:
        """Whether the procs' output goes through pipes at all (else: inherited)."""
        return self.forward or self.capture or self.tail > 0


class ProcOutput:
    """One proc's pipes as its agent reads them (on the process's ``fd_watch`` thread), the
    tail of its stderr, and the report of its exit, made once they are read to their end."""

    def __init__(self, tail: int) -> None:
        self._tail: deque[str] = deque(maxlen=max(tail, 0))
        self._lock = threading.Lock()
        self._open = 2
        """Pipes not yet read to their end."""
        self._report: Callable[[], None] | None = None
        """What ``after_end`` waits to run."""

    def keep(self, text: str) -> None:
        """Lines of stderr (blank ones are not kept, as upstream's tail)."""
        if self._tail.maxlen:
            self._tail.extend(line for line in text.split("\n") if line.strip())

    def tail(self) -> tuple[str, ...]:
        return tuple(self._tail)

    def after_end(self, report: Callable[[], None]) -> None:
        """The proc exited: run ``report`` once both pipes are read to their end (its last
        lines before its exit) and passed on, or ``DRAIN_AFTER_EXIT`` s from now if they
        are not (a child of the proc may hold them open; they are still read after)."""
        report = functools.partial(_after_printed, report)
        with self._lock:
            if self._open:
                self._report = report
                fd_watch.call_later(DRAIN_AFTER_EXIT, self._due)
                return
        report()

    def _ended(self) -> None:
        """A pipe is read to its end."""
        with self._lock:
            self._open -= 1
            report = self._report if not self._open else None
            if report is not None:
                self._report = None
        if report is not None:
            report()

    def _due(self) -> None:
        with self._lock:
            report, self._report = self._report, None
        if report is not None:
            report()


def forward_output(
    runtime: Runtime, child: Piped, rank: int, events: PortRef, plan: OutputPlan
) -> ProcOutput:
    """Read ``child``'s stdout and stderr pipes from now on (see the module docstring), on
    the process's one thread that waits on descriptors (no thread per pipe). Raises
    ``RuntimeError`` where that thread cannot start."""
    output = ProcOutput(plan.tail)
    files = host_files() if plan.capture else None
    for stream, pipe in ((1, child.stdout), (2, child.stderr)):
        assert pipe is not None
        reader = _Pipe(runtime, pipe, stream, rank, events, plan, output, files)
        fd_watch.add(pipe.fileno(), reader.readable)
    return output


class _Pipe:
    """One of a proc's pipes: whole lines passed on and sent as they come."""

    def __init__(
        self,
        runtime: Runtime,
        pipe: IO[bytes],
        stream: int,
        rank: int,
        events: PortRef,
        plan: OutputPlan,
        output: ProcOutput,
        files: HostFiles | None,
    ) -> None:
        self.runtime = runtime
        self.pipe = pipe
        self.fd = pipe.fileno()
        os.set_blocking(self.fd, False)
        self.stream = stream
        self.rank = rank
        self.events = events
        self.plan = plan
        self.output = output
        self.files = files
        self.prefix = f"[{rank}] " if plan.prefix else ""
        self.pending = b""

    def readable(self) -> bool:
        """Read what is there; at the end, what is left goes out and the pipe closes."""
        try:
            data = os.read(self.fd, READ_SIZE)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            self._end()
            return False
        pending = self.pending + data
        end = pending.rfind(b"\n")
        if end >= 0:  # whole lines, passed on and sent as one write each
            whole, pending = pending[: end + 1], pending[end + 1 :]
            self._send(whole)
        elif len(pending) >= LONGEST_LINE:
            self._send(pending)
            pending = b""
        self.pending = pending
        return True

    def _end(self) -> None:
        if self.pending:
            self._send(self.pending)
            self.pending = b""
        # Closed by its file object, which the child holds too: an ``os.close`` would
        # leave that object to close the number again when collected, by then perhaps a
        # later proc's pipe (whose output was lost).
        with contextlib.suppress(OSError):
            self.pipe.close()
        self.output._ended()

    def _send(self, data: bytes) -> None:
        stream, plan = self.stream, self.plan
        _pass_on(stream, data, self.events, plan)
        text = (data[:-1] if data.endswith(b"\n") else data).decode(errors="replace")
        if stream == 2:
            self.output.keep(text)
        if self.files is not None:
            lines = text.split("\n")
            self.files.write(stream, "".join(f"{self.prefix}{line}\n" for line in lines))
        if plan.forward:
            with contextlib.suppress(RuntimeError):  # the agent's loop is closed: exiting
                self.runtime.send_to_port(self.events, LogLines(self.rank, stream, text, _HOST))


class HostFiles:
    """The host's two files of its procs' output (upstream's file capture), one per agent
    process, shared by all its procs: whole lines, appended under a lock."""

    def __init__(self, directory: Path) -> None:
        stem = f"monarch_log_{_HOST}_{secrets.token_urlsafe(9)}"
        directory.mkdir(parents=True, exist_ok=True)
        self.paths = {n: directory / f"{stem}.{name}" for n, name in ((1, "stdout"), (2, "stderr"))}
        self._files = {n: path.open("a", encoding="utf-8") for n, path in self.paths.items()}
        self._lock = threading.Lock()
        logging.getLogger("monarch.core").info(
            "procs' output captured to %s and %s", self.paths[1], self.paths[2]
        )

    def write(self, stream: int, text: str) -> None:
        with self._lock:
            file = self._files.get(stream)
            if file is None:
                return
            try:
                file.write(text)
                file.flush()
            except (OSError, ValueError):  # a full or removed disk costs the file only
                del self._files[stream]


_host_files: Final = PerProcess(lambda: HostFiles(log_dir()))


def host_files() -> HostFiles | None:
    """This agent's files (opened at the first proc that asks); None where they cannot be."""
    try:
        return _host_files.get()
    except OSError as exc:
        logging.getLogger("monarch.core").warning("no file capture: %s", exc)
        return None


def _pass_on(stream: int, data: bytes, events: PortRef, plan: OutputPlan) -> None:
    """The agent's copy of a proc's output on its own stream, but where this process is
    also the spawner and its sink prints the lines (stream_to_client): printed once, not
    raw and then again with where they came from (as upstream does)."""
    sink = _local_sinks.get(events) if plan.forward else None
    if sink is None or not sink.stream:
        _print(stream, data)  # by the printer: a stream nobody drains must not stall the
        # thread that reads every proc's pipes and hears their exits


def _write_all(fd: int, data: bytes) -> None:
    """Pass ``data`` on to this process's own ``fd``; a closed one is given up on."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass


def handle_set_log_level(
    runtime: Runtime, body: SetLogLevel, payload: Sequence[Buffer], sender: str
) -> None:
    """``logging_option(level=...)``: the level of this proc's root Python logger."""
    logging.getLogger().setLevel(body.level)


# -- the spawner: printing it ----------------------------------------------------------------


class LogSink:
    """One proc mesh's forwarded output at its spawner (see the module docstring)."""

    def __init__(
        self,
        name: str,
        hosts: list[str],
        call_later: Callable[..., object],
        events: PortRef | None = None,
    ) -> None:
        """``events``: the port its lines come to, by which an agent in this same process
        finds the sink (see ``_pass_on``)."""
        self.name = name
        self.hosts = hosts
        """Each rank's host agent."""
        self.call_later = call_later
        self.stream = False
        self.window: float | None = None
        self._windows: dict[int, _Window] = {}
        _sinks.add(self)
        if events is not None:
            _local_sinks[events] = self

    def configure(self, stream: bool, window: float | None) -> None:
        self.flush()
        self.stream, self.window = stream, window

    def receive(self, lines: LogLines) -> None:
        """Lines of one proc arrived (on the loop)."""
        if not self.stream:
            return
        if self.window is None:
            agent = self.hosts[lines.rank] if 0 <= lines.rank < len(self.hosts) else "?"
            where = f"[{lines.host} {self.name}-{lines.rank}@{agent}] [{lines.rank}] "
            out = "".join(f"{where}{line}\n" for line in lines.text.split("\n"))
            _print(lines.stream, out)
            return
        window = self._windows.get(lines.stream)
        if window is None:
            window = self._windows[lines.stream] = _Window()
            self.call_later(self.window, self._close_window, lines.stream, window)
        # Grouped by the printer, not here on the loop: comparing each line with a
        # window's groups takes time (thousands of lines a second from a large mesh).
        _by_printer(functools.partial(window.add_lines, lines.rank, lines.text))

    def _close_window(self, stream: int, window: _Window) -> None:
        if self._windows.get(stream) is window:
            del self._windows[stream]
            _by_printer(functools.partial(_print_window, stream, window))

    def flush(self) -> None:
        """Print what the open windows hold (a stop, a new option, the end)."""
        windows, self._windows = self._windows, {}
        for stream, window in windows.items():
            _by_printer(functools.partial(_print_window, stream, window))


def _print_window(stream: int, window: _Window) -> None:
    """On the printer, after the lines given it before."""
    _print_now(stream, window.block(colour=_is_tty(stream)))


class _Group:
    """Similar lines of one window: the first, its rank, how many (and the first's
    characters counted, for ``_far_apart``)."""

    __slots__ = ("chars", "count", "pattern", "rank", "text")

    def __init__(self, text: str, rank: int, chars: Mapping[str, int]) -> None:
        self.text, self.rank, self.count, self.chars = text, rank, 1, chars
        self.pattern = _Pattern(text)


class _Window:
    """The lines of one aggregation window: groups of similar lines, in arrival order."""

    def __init__(self) -> None:
        self.opened = time.time()
        self.groups: list[_Group] = []

    def add(self, rank: int, line: str) -> None:
        chars = Counter(line)
        for group in self.groups[:MOST_GROUPS]:
            if similar(group.text, line, group.pattern, (group.chars, chars)):
                group.count += 1
                return
        self.groups.append(_Group(line, rank, chars))

    def add_lines(self, rank: int, text: str) -> None:
        for line in text.split("\n"):
            self.add(rank, line)

    def block(self, colour: bool = True) -> str:
        """The window as upstream prints it; ``colour``: with its ANSI colours (a terminal;
        a file or a pipe gets plain text, where upstream writes the codes too)."""

        def stamp(when: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))

        cyan, yellow, reset = (CYAN, YELLOW, RESET) if colour else ("", "", "")
        lines = [f"{cyan}>>> Aggregated Logs ({stamp(self.opened)}) >>>{reset}\n"]
        lines += [
            f"{yellow}[{g.count} similar log lines]{reset} [{g.rank}] {g.text}\n"
            for g in self.groups
        ]
        lines.append(f"{cyan}<<< Aggregated Logs ({stamp(time.time())}) <<<{reset}\n\n")
        return "".join(lines)


def _far_apart(a: Mapping[str, int], b: Mapping[str, int], most: int) -> bool:
    """Whether two lines with these characters counted are more than ``most`` edits apart,
    by a bound that needs no alignment: an edit changes the counts by at most 2 (a
    substitution; an insertion or a deletion by 1), so ``sum |a - b| > 2 * most`` is."""
    beyond = 2 * most
    apart = 0
    for char, count in a.items():
        apart += abs(count - b.get(char, 0))
        if apart > beyond:
            return True
    for char, count in b.items():
        if char not in a:
            apart += count
            if apart > beyond:
                return True
    return False


def similar(
    a: str,
    b: str,
    pattern: _Pattern | None = None,
    counts: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
) -> bool:
    """Whether ``b`` is ``a`` with at most ``SIMILARITY`` of its length edited (Levenshtein;
    ``pattern``: ``a``'s, and ``counts``: both lines' characters counted, made once for a
    group compared with many lines: most pairs are then told apart without the distance)."""
    if a == b:
        return True
    limit = int(SIMILARITY * max(len(a), len(b)))
    if limit == 0 or abs(len(a) - len(b)) > limit:
        return False
    if counts is not None and _far_apart(*counts, limit):
        return False
    return (pattern or _Pattern(a)).distance(b) <= limit


class _Pattern:
    """A line's characters as bit masks, for its edit distance to other lines computed a
    machine word's worth of cells at a time (Myers' bit-parallel algorithm, Hyyrö's form
    for the whole-string distance): some 7x faster in Python than the table cell by cell,
    for a window that compares thousands of lines with hundreds of groups."""

    __slots__ = ("full", "length", "masks", "top")

    def __init__(self, text: str) -> None:
        self.length = len(text)
        self.masks: dict[str, int] = {}
        bit = 1
        for char in text:
            self.masks[char] = self.masks.get(char, 0) | bit
            bit <<= 1
        self.full = (1 << self.length) - 1
        self.top = 1 << (self.length - 1) if self.length else 0

    def distance(self, other: str) -> int:
        """The Levenshtein distance from this pattern's text to ``other``."""
        if not self.length:
            return len(other)
        masks, full, top = self.masks, self.full, self.top
        pv, mv, score = full, 0, self.length
        for char in other:
            eq = masks.get(char, 0)
            xv = eq | mv
            xh = (((eq & pv) + pv) ^ pv) | eq
            ph = mv | (~(xh | pv) & full)
            mh = pv & xh
            if ph & top:
                score += 1
            elif mh & top:
                score -= 1
            ph = ((ph << 1) | 1) & full
            mh = (mh << 1) & full
            pv = mh | (~(xv | ph) & full)
            mv = ph & xv
        return score


# -- one printer per process -------------------------------------------------------------------

_sinks: weakref.WeakSet[LogSink] = weakref.WeakSet()
_local_sinks: weakref.WeakValueDictionary[PortRef, LogSink] = weakref.WeakValueDictionary()
"""This process's sinks by the port their lines come to."""
_queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
_printer: list[threading.Thread] = []
_printer_lock = threading.Lock()


def _print(stream: int, text: str | bytes) -> None:
    """Print ``text`` on ``stream`` (1 or 2) of this process by its printer thread: a
    ``str`` through ``sys.stdout``/``sys.stderr``, ``bytes`` (a proc's output passed on)
    to the descriptor itself."""
    _by_printer(functools.partial(_print_now, stream, text))


def _by_printer(work: Callable[[], None]) -> None:
    """Have the printer thread run ``work``, after what was given it before. Where no
    thread can start, run here."""
    if not _printer:
        with _printer_lock:
            if not _printer:
                thread = threading.Thread(target=_run_printer, name="monarch-logs", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # the process is at its limit of threads
                    work()
                    return
                _printer.append(thread)
                atexit.register(_finish_printing)
    _queue.put(work)


def _is_tty(stream: int) -> bool:
    out = sys.stdout if stream == 1 else sys.stderr
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


class _Once:
    """A callback that runs at most once, whichever of its callers comes first."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback: Callable[[], None] | None = callback
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            callback, self._callback = self._callback, None
        if callback is not None:
            callback()


def _after_printed(callback: Callable[[], None]) -> None:
    """Run ``callback`` once what this process queued for printing so far is written (a
    proc's exit is reported after its last lines are on the agent's streams), or
    ``PRINT_GRACE`` s from now, whichever comes first."""
    if not _printer:  # nothing was ever queued
        callback()
        return
    once = _Once(callback)
    _queue.put(once)
    with contextlib.suppress(RuntimeError):  # no thread for the timer: the printer runs it
        fd_watch.call_later(PRINT_GRACE, once)


def _run_printer() -> None:
    unpin_this_thread()  # started where the loop may be pinned (``_placement``)
    while (work := _queue.get()) is not None:
        try:
            work()
        except Exception:
            logging.getLogger("monarch.core").exception("the printer's work failed")


def _print_now(stream: int, text: str | bytes) -> None:
    if isinstance(text, bytes):
        _write_all(stream, text)
        return
    out: TextIO = sys.stdout if stream == 1 else sys.stderr
    with contextlib.suppress(Exception):  # a closed or broken stream: nothing to do
        out.write(text)
        out.flush()


def _finish_printing() -> None:
    """At exit: what the sinks' windows hold and what is queued is printed (a second or so
    at most)."""
    for sink in list(_sinks):
        sink.flush()
    _queue.put(None)
    for thread in _printer:
        thread.join(1.0)
