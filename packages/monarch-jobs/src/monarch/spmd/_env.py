"""The environment torchrun gives each process, computed from a proc's point in its mesh.

The last dimension of the mesh is the processes of one machine (``{"hosts": 2, "gpus":
8}``: a proc's ``gpus`` coordinate is its LOCAL_RANK); the dimensions before it number
the machines (GROUP_RANK). A mesh of one dimension is one machine.
"""

from __future__ import annotations

from collections.abc import Mapping

RUN_ID = "monarch"
"""TORCHELASTIC_RUN_ID: one run of the script (there are no elastic restarts here)."""


def elastic_env(
    point: Mapping[str, int], sizes: Mapping[str, int], master_addr: str, master_port: int
) -> dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE, ... for the proc at ``point`` of a mesh of ``sizes``
    (the same dimensions, in row-major order)."""
    dims = list(sizes)
    if list(point) != dims:
        raise ValueError(f"point {dict(point)!r} does not match the mesh's dimensions {dims}")
    if not 0 < master_port < 65536:
        raise ValueError(f"master_port must be a port number, not {master_port!r}")
    rank = 0
    for dim in dims:
        if not 0 <= point[dim] < sizes[dim]:
            raise ValueError(f"point {dict(point)!r} is outside {dict(sizes)!r}")
        rank = rank * sizes[dim] + point[dim]
    world = 1
    for size in sizes.values():
        world *= size
    local_dim = dims[-1] if dims else None
    local_rank = point[local_dim] if local_dim else 0
    local_world = sizes[local_dim] if local_dim else 1
    values = {
        "RANK": rank,
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": local_world,
        "GROUP_RANK": rank // local_world,
        "GROUP_WORLD_SIZE": world // local_world,
        "ROLE_RANK": rank,
        "ROLE_WORLD_SIZE": world,
        "ROLE_NAME": "default",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port,
        "TORCHELASTIC_RUN_ID": RUN_ID,
        "TORCHELASTIC_RESTART_COUNT": 0,
        "TORCHELASTIC_MAX_RESTARTS": 0,
    }
    return {name: str(value) for name, value in values.items()}
