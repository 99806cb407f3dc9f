"""The runtime's own log records: a file of the whole job's, apart from the user's logs.

As upstream's: every process of a job (client, procs, workers) appends its internal
records to ``/tmp/$USER/monarch_log.log``, at the level ``MONARCH_FILE_LOG`` names (default
INFO), and the client says where on stderr when its runtime starts ("Monarch internal logs
are being written to ...; execution id ..."). ``MONARCH_STDERR_LOG`` (default WARNING) is
the level from which they are printed on stderr as well.

Records of the ``monarch.*`` loggers do not propagate to the user's handlers as they are:
the file takes INFO and the user's log would fill with the runtime's. Those the user
would have seen anyway (WARNING and up, or from the level the user set on a ``monarch.*``
logger, as ``caplog`` does) are handed to the root logger's handlers; where none of those
shows them on a stream (plain scripts have none; an exporter's is not one), they are
printed on stderr, bare, as Python's last resort prints them.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Final

FILE_LEVEL_ENV: Final = "MONARCH_FILE_LOG"
STDERR_LEVEL_ENV: Final = "MONARCH_STDERR_LOG"
PATH_ENV: Final = "MONARCH_INTERNAL_LOG"
"""Ours: another file for the internal records, or ``off`` for none."""
EXECUTION_ENV: Final = "MONARCH_EXECUTION_ID"
"""The client's execution id, which procs on its host inherit and write on each line."""

_LEVELS: Final = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "off": logging.CRITICAL + 10,
}
_LETTERS: Final = {
    logging.DEBUG: "D",
    logging.INFO: "I",
    logging.WARNING: "W",
    logging.ERROR: "E",
    logging.CRITICAL: "C",
}


def level_of(env: str, default: int) -> int:
    """The level an environment variable names (upstream's TRACE..ERROR, any case)."""
    text = os.environ.get(env, "").strip().lower()
    if not text:
        return default
    if text in _LEVELS:
        return _LEVELS[text]
    print(
        f"monarch: {env}={os.environ[env]!r} is not a log level "
        f"(one of {', '.join(k.upper() for k in _LEVELS)}); using {logging.getLevelName(default)}",
        file=sys.stderr,
    )
    return default


_USER_ENV: Final = ("LOGNAME", "USER", "LNAME", "USERNAME")
"""What ``getpass.getuser`` reads before the password database."""

_users: dict[tuple[int, tuple[str | None, ...]], str] = {}
"""``_user()``'s answers: a zygote finds it once (its password-database lookup costs each
proc ~0.7 ms, the first thing it logs) and its procs, same uid and names, reuse it."""


def _user() -> str:
    key = (os.getuid(), tuple(os.environ.get(name) for name in _USER_ENV))
    known = _users.get(key)
    if known is None:
        try:
            known = getpass.getuser()
        except (KeyError, OSError):
            known = str(os.getuid())
        _users[key] = known
    return known


def log_path() -> Path | None:
    """Where the internal records go (None: nowhere)."""
    chosen = os.environ.get(PATH_ENV, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path("/tmp") / _user() / "monarch_log.log"


def log_dir() -> Path:
    """The job's log folder: the internal log's (``/tmp/$USER``), where procs' captured
    output goes too (``enable_file_capture``)."""
    path = log_path()
    return path.parent if path is not None else Path("/tmp") / _user()


def execution_id() -> str:
    """This job's execution id (the client's, inherited by its procs), made once."""
    known = os.environ.get(EXECUTION_ENV)
    if not known:
        stamp = time.strftime("%b-%d_%H:%M")
        known = f"{_user()}_{stamp}_{secrets.randbelow(1000):03d}"
        os.environ[EXECUTION_ENV] = known
    return known


class _Format(logging.Formatter):
    """glog's shape, as upstream's lines: ``[role]I1127 04:39:07.481949 pid name:line] msg``."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(record.created))
        micros = int((record.created % 1) * 1_000_000)
        letter = _LETTERS.get(record.levelno, "I")
        text = record.getMessage()
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        where = f"{record.name}:{record.lineno}"
        return f"[{self.role}]{letter}{stamp}.{micros:06d} {record.process} {where}] {text}"


def _user_level(name: str) -> int:
    """The level the user asked of a ``monarch.*`` logger: the nearest one set below
    ``monarch`` (``caplog.at_level(..., logger=...)`` sets one), else the root's."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None and logger.name != "monarch":
        if logger.level:
            return logger.level
        logger = logger.parent
    user = _Handler.user_level
    return user if user else logging.getLogger().level


def _on_a_stream(handler: logging.Handler) -> bool:
    """Whether a handler shows what it takes on a stream (a terminal, a pipe); an
    exporter's (OpenTelemetry's) or a file's does not."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler
    )


class _Handler(logging.Handler):
    """The one handler on ``monarch``: the file, the user's handlers, stderr (module doc)."""

    user_level: int = logging.NOTSET
    """A level the user had set on ``monarch`` itself before this was installed."""

    def __init__(self, role: str, path: Path | None, file_level: int, stderr_level: int) -> None:
        super().__init__()
        self.path = path
        self.file_level = file_level
        self.stderr_level = stderr_level
        self.lines = _Format(role)
        self.formatter = self.lines
        self.pid = os.getpid()
        """The process that installed it (a fork finds its parent's: see
        ``install_internal_logs``)."""
        monarch = logging.getLogger("monarch")
        self.prior = (monarch.level, monarch.propagate)
        """The ``monarch`` logger's level and propagation before it was installed."""
        self.file = None
        if path is not None:
            with contextlib.suppress(OSError):  # an unwritable /tmp costs the file only
                path.parent.mkdir(parents=True, exist_ok=True)
                self.file = path.open("a", encoding="utf-8", buffering=1)

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is not None and record.levelno >= self.file_level:
            try:
                self.file.write(self.format(record) + "\n")
            except (OSError, ValueError):
                self.file = None
        root = logging.getLogger()
        shown = False
        if root.handlers and record.levelno >= _user_level(record.name):
            for handler in root.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)
                    shown = shown or _on_a_stream(handler)
        if not shown and record.levelno >= self.stderr_level:
            stream = sys.stderr
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.write(logging.lastResort.format(record) + "\n")  # type: ignore[union-attr]


_installed: list[_Handler] = []


def install_internal_logs(role: str, *, banner: bool = False) -> Path | None:
    """Send this process's ``monarch.*`` records to the job's file (once per process);
    ``banner``: say where on stderr (the client).

    A fork of a process that installed them (a proc of a zygote, which installs them
    before it forks) takes that handler and its open file under its own name when the
    file and levels it would choose are the same: setting the ``monarch`` logger's level
    clears every logger's cache, and a new handler and file take ~200 more objects, each
    written where the fork shares its zygote's pages (~300-450 page copies a proc)."""
    path = log_path()
    if _installed and _installed[0].pid == os.getpid():
        return path
    file_level = level_of(FILE_LEVEL_ENV, logging.INFO)
    stderr_level = level_of(STDERR_LEVEL_ENV, logging.WARNING)
    logger = logging.getLogger("monarch")
    if _installed:
        inherited = _installed[0]
        if (inherited.path, inherited.file_level, inherited.stderr_level) == (
            path,
            file_level,
            stderr_level,
        ):
            inherited.lines.role = f"{execution_id()} {role}"
            inherited.pid = os.getpid()
            return path if inherited.file is not None else None
        forget_internal_logs()  # its parent's choice: this process's instead
    handler = _Handler(f"{execution_id()} {role}", path, file_level, stderr_level)
    _Handler.user_level = logger.level
    wanted = [stderr_level, file_level if handler.file else stderr_level]
    if logger.level:
        wanted.append(logger.level)
    elif logging.getLogger().handlers:
        wanted.append(logging.getLogger().level)  # a user's DEBUG still sees ours
    logger.setLevel(min(wanted))
    logger.addHandler(handler)
    logger.propagate = False
    _installed.append(handler)
    if banner and handler.file is not None:
        print(
            f"Monarch internal logs are being written to {path}; execution id {execution_id()}",
            file=sys.stderr,
            flush=True,
        )
    return path if handler.file is not None else None


def forget_internal_logs() -> None:
    """Remove the handler a fork inherited (and close its descriptor of the file), the
    ``monarch`` logger as it was before: a program its zygote forks (``python -m`` run as
    it would) starts without it, as a new Python would, since such a program may close the
    descriptors it inherited, and a record written then would go to whatever took that
    number (a job's workers wrote log lines into their zygote's socket)."""
    if not _installed:
        return
    inherited = _installed.pop()
    logger = logging.getLogger("monarch")
    logger.removeHandler(inherited)
    logger.setLevel(inherited.prior[0])
    logger.propagate = inherited.prior[1]
    if inherited.file is not None:
        with contextlib.suppress(OSError, ValueError):
            inherited.file.close()  # this process's descriptor of it only
