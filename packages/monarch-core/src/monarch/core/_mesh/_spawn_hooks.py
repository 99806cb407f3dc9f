"""Upstream's hooks on a new proc mesh: the spawn callbacks (telemetry, monitoring) that
``ProcMesh.from_host_mesh`` calls with every proc mesh, and the actor that runs its
``setup`` on each proc before the mesh is handed out."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ._endpoint import Actor, endpoint

SpawnCallback = Callable[[Any], None]
"""Called with a new ``ProcMesh`` (a floor above this module: not named here)."""

_callbacks: list[SpawnCallback] = []


def register_proc_mesh_spawn_callback(callback: SpawnCallback) -> None:
    """Call ``callback`` with every proc mesh spawned from now on (as upstream's)."""
    _callbacks.append(callback)


def unregister_proc_mesh_spawn_callback(callback: SpawnCallback) -> None:
    """Stop calling ``callback``; ``ValueError`` if it was not registered (as upstream's)."""
    _callbacks.remove(callback)


def spawned(mesh: Any) -> None:
    """Tell the registered callbacks of a new proc mesh."""
    for callback in list(_callbacks):
        callback(mesh)


Setup = Callable[[], None] | Callable[[], Awaitable[None]]


class SetupActor(Actor):
    """Runs a ``from_host_mesh`` setup function on its proc (upstream's ``SetupActor``)."""

    @endpoint
    async def setup(self, function: Setup) -> None:
        result = function()
        if inspect.isawaitable(result):
            await result
