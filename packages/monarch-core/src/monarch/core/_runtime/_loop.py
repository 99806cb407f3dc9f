"""The event loop a runtime runs on: uvloop when installed, else asyncio's.

The ``event_loop`` key picks one (tests run the same scenario on both: their timing, and
so their races, differ).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from monarch.core._config import current_config
from monarch.core._placement import unpin_this_thread


def new_event_loop(*, runtime: bool = True) -> asyncio.AbstractEventLoop:
    """A loop; a runtime's (which ``_placement`` may pin to one CPU) has an executor whose
    threads (``run_in_executor``, ``to_thread``), started from it, take the process's CPUs
    back first. An async actor's loop (``runtime=False``) is never pinned."""
    loop = _new_event_loop()
    if runtime:
        loop.set_default_executor(ThreadPoolExecutor(initializer=unpin_this_thread))
    return loop


def _new_event_loop() -> asyncio.AbstractEventLoop:
    choice = current_config().event_loop
    if choice == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
