"""torchrun-style SPMD scripts on a Monarch mesh (upstream's ``monarch.spmd``).

``setup_torch_elastic_env(proc_mesh)`` gives every proc the environment torchrun would
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...; the last dimension of the
mesh is the procs of one machine), so ``torch.distributed.init_process_group()`` works in
its actors; ``SPMDActor.main`` runs a whole script that way.
"""

from __future__ import annotations

from monarch.core import ProcMesh, current_runtime, run_on

from ._actor import SPMDActor


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: bool | None = None,
) -> None:
    """``setup_torch_elastic_env`` for async code."""
    actors = proc_mesh.spawn("spmd_env", SPMDActor)
    if master_addr is None or master_port is None:
        if master_addr is not None or master_port is not None:
            raise ValueError("give both master_addr and master_port, or neither")
        first = actors.slice(**dict.fromkeys(proc_mesh.extent.labels, 0))
        master_addr, master_port = await first.get_host_port.call_one(use_ipaddr)
    await actors.setup_env.call(master_addr, master_port)


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: bool | None = None,
) -> None:
    """Set torchrun's environment in every proc of ``proc_mesh``; the rendezvous is at
    ``master_addr:master_port``, by default an address and free port of the first proc's
    machine (``use_ipaddr``: its IP address rather than its host name)."""
    setup = setup_torch_elastic_env_async(proc_mesh, master_addr, master_port, use_ipaddr)
    run_on(current_runtime(), setup).get()


__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
