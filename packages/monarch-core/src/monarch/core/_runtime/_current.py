"""The runtime of this process: at most one, installed by ``_bootstrap``.

Code of every floor asks for it with ``current_runtime()``. In a client the first such
call starts one (the controller's runtime): the starting itself is the bootstrap's, which
installs itself as the starter when ``monarch.core`` is imported, so this floor needs
nothing above it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._router import Runtime

Starter = Callable[[str | None], Runtime]
"""Starts and installs this process's runtime, listening at the address given (or where
the configuration says)."""

_runtime: Runtime | None = None
_lock = threading.Lock()
_starter: Starter | None = None


def current_runtime(listen: str | None = None) -> Runtime:
    """This process's runtime, starting the controller's on first use.

    ``listen`` is where a runtime this call starts listens (default: per the configured
    ``default_transport``); it does not move a runtime already running.
    """
    runtime = _runtime
    if runtime is None:
        with _lock:
            runtime = _runtime
            if runtime is None:
                if _starter is None:
                    raise RuntimeError("monarch.core was not imported: no runtime can start")
                runtime = _starter(listen)
    return runtime


def running_runtime() -> Runtime | None:
    """This process's runtime if one runs; never starts one."""
    return _runtime


def install_runtime(runtime: Runtime | None) -> None:
    """Make ``runtime`` this process's runtime (``None``: there is none any more)."""
    global _runtime
    _runtime = runtime


def set_starter(starter: Starter) -> None:
    """Who starts a runtime on first use (``_bootstrap`` does, once)."""
    global _starter
    _starter = starter


def on_loop_thread() -> bool:
    """Whether the calling thread runs this process's runtime loop (where blocking on a
    Future would deadlock)."""
    runtime = _runtime
    return runtime is not None and runtime.on_loop()
