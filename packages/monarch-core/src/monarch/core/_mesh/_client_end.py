"""How an unhandled failure ends the client: its report once, then exit status 1.

The failure reaches the client on the runtime's threads while the main thread may be
blocked anywhere (a future's ``get()``, ``time.sleep``, user code). A real signal wakes
it; its handler raises ``SystemExit(1)`` there, so ``finally`` blocks and context
managers run and Python ends without a traceback. The signal is a real-time one nobody
else handles (``prepare`` installs the handler from the main thread when the client's
runtime starts); where none could be installed it is SIGINT, as upstream's
``KeyboardInterrupt``. A script that swallows the ``SystemExit`` still ends with status 1
(``exit_status``, at exit).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Final

_ending = threading.Event()
_lock = threading.Lock()
_signal: int | None = None
"""The signal whose handler ends the main thread: chosen and installed by ``prepare``."""

EXIT_STATUS: Final = 1
"""The client's exit status after an unhandled failure (upstream's hook: ``sys.exit(1)``)."""


def _main_done() -> bool:
    """Whether the main thread is done: in ``threading._shutdown`` (joining threads; an
    exception there prints "Exception ignored"), or Python is finalizing."""
    shutting_down = bool(getattr(threading, "_SHUTTING_DOWN", False))
    return shutting_down or sys.is_finalizing() or not threading.main_thread().is_alive()


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    """In the main thread: unwind it with ``SystemExit``, unless it is already done."""
    if _ending.is_set() and not _main_done():
        raise SystemExit(EXIT_STATUS)


def prepare() -> None:
    """Install the ending signal's handler: only the main thread can, once per process."""
    global _signal
    if _signal is not None or threading.current_thread() is not threading.main_thread():
        return
    for signum in range(signal.SIGRTMIN + 2, signal.SIGRTMAX - 2):  # glibc's first are its own
        try:
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, _raise_exit)
                _signal = signum
                return
        except (OSError, ValueError):
            continue


def ending() -> bool:
    """Whether an unhandled failure is ending this client."""
    return _ending.is_set()


def end_client(report: str) -> None:
    """Write ``report`` and end the client; a second failure meanwhile is only logged (the
    user reads one report, not one per mesh that lost the same proc)."""
    with _lock:
        if _ending.is_set():
            logging.getLogger("monarch.actor").info("while ending: %s", report)
            return
        _ending.set()
    sys.stderr.write(report)
    sys.stderr.flush()
    if _main_done():
        return  # exit_status sets the status
    signum = _signal if _signal is not None else signal.SIGINT
    signal.pthread_kill(threading.main_thread().ident or 0, signum)


def exit_status() -> None:
    """At exit, last of monarch's handlers: after an unhandled failure the status is 1,
    even when the script caught the ``SystemExit`` and went on. Not in an IPython kernel,
    which outlives the cell that failed."""
    if not _ending.is_set() or "ipykernel" in sys.modules:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_STATUS)
