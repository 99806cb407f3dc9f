"""A proc's start rehearsed in its zygote, so that its forks do not each warm it up.

CPython specializes a function's bytecode in place once it has run a few times (3.11:
its eighth call; 3.12 on: as its instructions first run), writing to its code object. A
proc forked from a zygote that never ran the messaging code does that writing itself, as
it dials, answers its spawner's handshake and reads its first messages, and each write
copies a page it shared with the zygote (4-6 us of CPU a page on a VM; a forked proc
copies ~2,300 of them before its first answer). So the zygote runs what every proc runs
as it starts: two runtimes on a fresh event loop dial each other (the
handshake in both roles), send values to each other's ports, a spawn's class is read
back from its pickle, and everything is closed again: no loop, thread or socket is left
for a fork to copy. ``ROUNDS`` rounds of a few milliseconds each, once the zygote has had
no request for a while, one whenever none waits (``_zygote_proc.serve``), so a fork waits
for one round at most.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Final

from monarch.core._payload._serialize import dumps, dumps_spawn, loads
from monarch.core._runner._local import read_spawn
from monarch.core._runtime._messages import Body, PortValue
from monarch.core._runtime._router import Runtime
from monarch.transport import Buffer

log = logging.getLogger(__name__)

ROUNDS: Final = 10
"""Rounds a zygote rehearses: 3.11 specializes a function at its eighth call."""

VALUES: Final = 8
"""Values each runtime of a round sends the other."""

DEADLINE: Final = 5.0
"""Seconds a round may take before it is given up (and the rehearsal with it)."""

rounds_done = [0]
"""Rounds this process rehearsed, its forks included (a proc says how warm it started)."""


def rehearse_round() -> bool:
    """One round (see the module docstring); False if it failed, and the zygote should
    stop rehearsing (its procs then warm up by themselves, as without it)."""
    # The standard library's loop, not uvloop's: libuv keeps a process-wide pipe from its
    # first loop on, which a program this zygote forks may close with the descriptors it
    # inherits (a job's workers do), after which libuv's fork handler closes whatever took
    # those numbers in the worker's own zygote (its socket to the worker).
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(_exchange(loop), DEADLINE))
        read_spawn(dumps_spawn(_rehearsed_class(), (), {}))
    except Exception:
        log.debug("the zygote's rehearsal of a proc's start failed", exc_info=True)
        return False
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    rounds_done[0] += 1
    return True


async def _exchange(loop: asyncio.AbstractEventLoop) -> None:
    secret = os.urandom(32)
    first, second = Runtime(loop, secret), Runtime(loop, secret)
    try:
        await first.start()
        await second.start()
        got: list[object] = []
        all_in = asyncio.Event()

        def take(body: Body, payload: Sequence[Buffer]) -> None:
            got.append(loads(payload))
            if len(got) == 2 * VALUES:
                all_in.set()

        to_first, to_second = first.open_port(take), second.open_port(take)
        for n in range(VALUES):
            first.send_to_port(to_second, PortValue(0), dumps(n))
            second.send_to_port(to_first, PortValue(1), dumps(n))
            await asyncio.sleep(0)
        await all_in.wait()
    finally:
        await first.aclose()
        await second.aclose()


def _rehearsed_class() -> type:
    """A class defined here and now, so that it is pickled by value, as a script's actor
    class is."""

    class Rehearsed:
        def __init__(self) -> None:
            self.value = 0

    return Rehearsed
