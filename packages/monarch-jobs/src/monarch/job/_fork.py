"""Local workers forked from the client: a ``ProcessJob`` host without a Python start.

A ``monarch worker`` started as a program spends nearly all of its start (0.2-0.3 s of
CPU here, most of a fresh job's wait) starting Python and importing ``monarch.core``,
which the client has already done. So where it is safe, ``ProcessJob`` forks the client
instead: the child leaves the client's session, drops every file descriptor the client
had (a worker must not hold the script's pipes or sockets open after the script ends),
logs to its own file and runs the worker loop (``start_worker_loop_forever``), then ends
with ``os._exit`` (no finalizer or ``atexit`` of the client runs there).

Safe means: Linux, no Monarch runtime started yet in the client, no other Python thread
and no running event loop (what a fork copies of those would be broken), the
``MONARCH_JOBS_FORK_WORKERS`` variable not ``0``. Otherwise workers are started as the
program (``python -m monarch.job._worker``).
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Mapping
from typing import Final

from monarch.actor import start_worker_loop_forever
from monarch.core import running_runtime

SWITCH: Final = "MONARCH_JOBS_FORK_WORKERS"
"""``0`` starts ProcessJob workers as programs even where forking is safe."""


def can_fork() -> bool:
    """Whether the client may fork its workers now (see the module docstring)."""
    return (
        sys.platform.startswith("linux")
        and os.environ.get(SWITCH, "1") != "0"
        and running_runtime() is None
        and threading.active_count() == 1
        and asyncio._get_running_loop() is None
    )


def fork_worker(address: str, log: str, env: Mapping[str, str]) -> int:
    """Fork a worker listening at ``address`` (its output in ``log``, ``env`` its
    environment, with the job secret); the child's pid. It prints ``address`` as the
    first line of the log once it listens, as ``monarch worker`` does."""
    with open(log, "wb"):
        pass  # there before the fork: the client reads it at once
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()  # what is garbage now is not finalized in the child (see gc.freeze)
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _become_worker_process(log, env)
        done = start_worker_loop_forever(address=address)
        print(address, flush=True)
        print(f"monarch worker: serving as host agent at {address}", file=sys.stderr, flush=True)
        done.get()
        code = 0
    except BaseException:  # noqa: BLE001 - said in the log, then the child ends
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _become_worker_process(log: str, env: Mapping[str, str]) -> None:
    """In the child: a session of its own, none of the client's descriptors, objects or
    log handlers, the log as stdout and stderr, the worker's environment."""
    os.setsid()
    gc.freeze()  # the client's objects: never finalized here (their descriptors are gone)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)  # the client's handlers are not the worker's
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_APPEND)  # made by the client before the fork
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    # The client's sys.stdout may be another file (pytest's capture): its descriptor is
    # gone, and its number may be a socket of the worker's next. Streams over 0-2 anew.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's, never closed
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    faulthandler.enable(sys.stderr)  # the client's, if any, wrote to a descriptor gone here
    # The client's log handlers write to descriptors gone here: dropped, never closed.
    logging.root.handlers[:] = []
    logging.basicConfig(level=logging.WARNING, format="monarch worker: %(message)s")
    os.environ.clear()
    os.environ.update(env)
