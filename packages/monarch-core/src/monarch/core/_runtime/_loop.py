"""The event loop a runtime runs on: uvloop when installed, else asyncio's.

The ``event_loop`` key picks one (tests run the same scenario on both: their timing, and
so their races, differ).
"""

from __future__ import annotations

import asyncio

from monarch.core._config import current_config


def new_event_loop() -> asyncio.AbstractEventLoop:
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
