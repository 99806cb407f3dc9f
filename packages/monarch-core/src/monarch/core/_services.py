"""What every Monarch process answers besides its actors: the control messages."""

from __future__ import annotations

from ._actor import handle_actor_failed, handle_spawn_actor, refuse_undeliverable
from ._controller import handle_get_controller
from ._host import handle_spawn_procs
from ._messages import ActorFailed, GetController, RunBootstrap, SpawnActor, SpawnProcs
from ._proc_mesh import handle_run_bootstrap
from ._runtime import Runtime


def install(runtime: Runtime) -> None:
    runtime.undeliverable = refuse_undeliverable
    runtime.control.update(
        {
            SpawnActor: handle_spawn_actor,
            SpawnProcs: handle_spawn_procs,
            RunBootstrap: handle_run_bootstrap,
            GetController: handle_get_controller,
            ActorFailed: handle_actor_failed,
        }
    )
