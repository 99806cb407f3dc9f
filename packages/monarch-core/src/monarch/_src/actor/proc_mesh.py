"""Upstream's ``monarch._src.actor.proc_mesh``: ``ProcMesh`` and the spawn callbacks that
its ``from_host_mesh`` calls with every new proc mesh."""

from monarch.core._mesh._proc_mesh import ProcMesh
from monarch.core._mesh._spawn_hooks import (
    register_proc_mesh_spawn_callback,
    unregister_proc_mesh_spawn_callback,
)

__all__ = [
    "ProcMesh",
    "register_proc_mesh_spawn_callback",
    "unregister_proc_mesh_spawn_callback",
]
