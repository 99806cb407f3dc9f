"""A script's zygote, started as the script imports ``monarch.actor``, before it spawns.

A script's first proc otherwise waits for one Python start and ``import monarch.core``
(~0.15 s here) after its spawn call: it is a new Python, or the fork of a zygote that
starts only then (``monarch.core._host._zygote``). Started as the script imports
``monarch.actor`` (~85 ms of its own importing, and whatever the script does before it
spawns), the zygote imports beside it, on the other CPU, and the first spawn forks its
procs from a zygote that is ready or nearly so. It is a new Python
(``python -m monarch.core._host._zygote_proc``), never a fork of the script: the script's
``__main__``, threads and handlers are no proc's.

Standard library only (``subprocess`` and ``socket``, which the core imports anyway),
so that the zygote starts before the core's own import: the core's ``_zygote`` adopts
it (``take``) at the first proc. Not in a proc (its procs come from its host's agent),
not where ``MONARCH_FORK_PROCS`` or ``MONARCH_PRESTART_ZYGOTE`` (the configuration keys
``fork_procs`` and ``prestart_zygote``, read here from the environment only: the import
comes before any ``configure()``) say no, and only on Linux (fork and ``SOCK_SEQPACKET``).
Unused, it ends with the script (its socket's end closes, and a parent-death signal).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterable
from typing import Final

FD_ENV: Final = "MONARCH_ZYGOTE_FD"
"""The zygote's end of its socket pair."""

PRELOAD_ENV: Final = "MONARCH_ZYGOTE_PRELOAD"
"""What the zygote imports for its procs from its start (comma-separated; see ``preloaded``)."""

AUTO_PRELOAD: Final = ("torch", "monarch.tensor")
"""What ``proc_preload="auto"`` preloads where the spawner has imported it: a proc that
imports torch itself spends seconds of CPU on it, each proc of a host at once; the tensor
engine's worker module another 0.1-0.4 s, at the first tensor command of a fresh mesh."""

COMMAND: Final = ("-m", "monarch.core._host._zygote_proc")
"""How a zygote is started, after the interpreter."""

PROC_ENV: Final = "MONARCH_PARENT_ADDRESS"
"""Set in every proc (its agent's address): a proc starts no zygote of its own."""

OFF: Final = frozenset({"0", "false", "f", "no", "n", "off"})

Launched = tuple["subprocess.Popen[bytes]", socket.socket]


def launch(preload: str = "") -> Launched:
    """Start a zygote as a new Python; our end of its socket pair. OSError if it cannot.
    ``preload``: what it imports for its procs from its start (see ``preloaded``)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = dict(os.environ)  # the job's secret is not there: read, it left (job_secret)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env[FD_ENV] = str(theirs.fileno())
    if preload:
        env[PRELOAD_ENV] = preload
    try:
        process = subprocess.Popen(
            [sys.executable, *COMMAND],
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=[theirs.fileno()],
            process_group=0,  # as procs (_bootstrap): a signal to the agent's group
            # (Ctrl-C, a Jupyter kernel interrupt) is not one to its procs
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


_started: list[tuple[int, Launched]] = []
"""The zygote started at import, with the pid of the process that started it (a fork of
the script has none: it is its parent's)."""


_in_zygote: list[bool] = []
"""Set in a zygote (see ``in_zygote``)."""


def in_zygote() -> None:
    """This process is a zygote: it starts none at an import of ``monarch.actor`` (its
    successor imports monarch.actor when it preloads monarch.tensor), nor do its forks."""
    _in_zygote[:] = [True]


def wanted() -> bool:
    """Whether this process starts its zygote at import (see the module docstring)."""
    env = os.environ
    return (
        sys.platform == "linux"
        and not _in_zygote
        and PROC_ENV not in env
        and env.get("MONARCH_FORK_PROCS", "1").strip().lower() not in OFF
        and env.get("MONARCH_PRESTART_ZYGOTE", "1").strip().lower() not in OFF
    )


def preloaded(chosen: str, imported: Iterable[str]) -> str:
    """What procs should find imported (the ``proc_preload`` key's value ``chosen``):
    ``auto``, those of ``AUTO_PRELOAD`` the spawner has ``imported``; else as chosen."""
    chosen = chosen.strip()
    if chosen == "auto":
        return ",".join(name for name in AUTO_PRELOAD if name in imported)
    return chosen


def prestart() -> None:
    """Start this script's zygote now, once, where wanted; quietly not where it cannot be
    started (the first proc then starts as it would have).

    What the script has imported by now that its procs should find imported (torch: a
    PyTorch script imports it first) the zygote starts importing for them at once (in a
    successor, ``_zygote_proc``), rather than at the first spawn: a proc that finds torch
    missing imports it at its first tensor (~1.5 s of CPU; 0.12 s to the first fetched
    value where it is there), and the time a script spends before it spawns is time
    that import has had."""
    if _started or not wanted():
        return
    chosen = os.environ.get("MONARCH_PROC_PRELOAD", "auto")
    try:
        _started.append((os.getpid(), launch(preloaded(chosen, sys.modules))))
    except OSError:
        pass


def take() -> Launched | None:
    """The zygote started at import, once, for this process's agent (None: none, or it
    was the parent's, this process being a fork of the script)."""
    if not _started:
        return None
    pid, launched = _started.pop()
    if pid != os.getpid():
        launched[1].close()
        return None
    return launched


def prestarted() -> bool:
    """Whether a zygote started at import waits for this process's first proc."""
    return bool(_started) and _started[0][0] == os.getpid()
