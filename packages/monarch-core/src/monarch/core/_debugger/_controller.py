"""Upstream's ``DebugController``: an actor in the root client that holds the sessions, for
code that wants them (``list``, ``wait_pending_session``; see ``_hooks.debug_controller``)."""

from __future__ import annotations

from typing import Any

from monarch.core._mesh._controller import get_or_spawn_controller
from monarch.core._mesh._endpoint import Actor, endpoint

from ._console import table
from ._sessions import DebugSessionInfo, sessions


class DebugController(Actor):
    """The job's sessions, as an actor (it lives in the root client, where they are)."""

    @endpoint
    async def list(self, print_output: bool = True) -> list[DebugSessionInfo]:
        infos = sessions.info()
        if print_output:
            print(table(infos), end="", flush=True)
        return infos

    @endpoint
    async def wait_pending_session(self) -> None:
        """Return once some actor is stopped at a breakpoint."""
        await sessions.arrived.wait()


def spawn_debug_controller() -> Any:
    """The job's DebugController, spawned in the root client if it is not yet there."""
    return get_or_spawn_controller("debug_controller", DebugController).get()
