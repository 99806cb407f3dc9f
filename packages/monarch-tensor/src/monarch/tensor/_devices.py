"""Which GPU a worker uses: upstream's environment for a tensor engine's proc.

Upstream's tensor worker, as it starts, gives its proc ``CUDA_VISIBLE_DEVICES`` = its
local rank (the ``gpus`` or ``gpu`` coordinate, else its rank modulo the host's GPUs), the
torchrun-style ranks and NCCL's host id, and makes ``torch.cuda.set_device`` only check
that the device asked for is the proc's own. A program written for upstream then finds
``device="cuda"`` on its own GPU, one GPU per proc, and may call ``set_device(local_rank)``
as it would under torchrun. Set before CUDA is initialized in the proc; after, the device
is the one CUDA already chose, and a warning says so.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Final

from monarch.core import Point
from monarch.core.lowlevel import cuda_initialized

logger = logging.getLogger(__name__)

VISIBLE: Final = "CUDA_VISIBLE_DEVICES"

_GPU_DIMS: Final = ("gpus", "gpu")


def local_device_count() -> int:
    """The GPUs this proc may use, without initializing CUDA (a forked proc that did
    cannot use CUDA in its children): the visible list where one is set, else the
    ``/dev/nvidiaN`` nodes, as upstream counts them."""
    visible = os.environ.get(VISIBLE)
    if visible is not None:
        return len(visible.split(","))
    try:
        return sum(1 for dev in Path("/dev").iterdir() if re.fullmatch(r"nvidia\d+", dev.name))
    except OSError:
        return 0


def worker_env(point: Point, proc_id: str) -> dict[str, str]:
    """The variables the worker at ``point`` sets (upstream's ``_initialize_env``). The
    device is picked from a visible list already set (``CUDA_VISIBLE_DEVICES=4,5`` and
    local rank 1 give ``5``), where upstream's gives the local rank itself."""
    dim = next((d for d in _GPU_DIMS if d in point), None)
    if dim is not None:
        local_rank, per_host = point[dim], point.size(dim)
    else:
        per_host = max(local_device_count(), 1)
        local_rank = point.rank % per_host
    visible = os.environ.get(VISIBLE)
    device = str(local_rank)
    if visible:
        devices = visible.split(",")
        device = devices[local_rank % len(devices)]
    return {
        VISIBLE: device,
        "NCCL_HOSTID": f"{proc_id}_host_{point.rank // per_host}",
        "NCCL_IGNORE_TOPO_LOAD_FAILURE": "true",
        "LOCAL_RANK": str(local_rank),
        "RANK": str(point.rank),
        "WORLD_SIZE": str(point.extent.nelements),
        "LOCAL_WORLD_SIZE": str(per_host),
    }


_taken: list[str] = []
"""The proc's device, once its first tensor engine took it."""


def take_device(point: Point, proc_id: str) -> None:
    """Give this proc the worker's environment and the checking ``set_device``, once: the
    engine of a slice of its mesh, started later on the same proc, keeps the device the
    first engine took (its point in the slice is not the proc's place on its host)."""
    if _taken:
        return
    env = worker_env(point, proc_id)
    _taken.append(env[VISIBLE])
    if cuda_initialized() and os.environ.get(VISIBLE) != env[VISIBLE]:
        logger.warning(
            "CUDA was initialized in this proc before its tensor engine started: it keeps "
            "the device CUDA chose (CUDA_VISIBLE_DEVICES %r -> %r is ignored)",
            os.environ.get(VISIBLE),
            env[VISIBLE],
        )
    os.environ.update(env)
    import torch

    if getattr(torch.cuda.set_device, "_monarch_check", False):
        return
    local_rank = env["LOCAL_RANK"]

    def check_set_device(device: Any) -> None:
        """The proc sees its one GPU as device 0: asking for it by the local rank, by
        0 or by its number on the host is allowed and changes nothing."""
        allowed = {local_rank, "0", os.environ.get(VISIBLE, "")}
        index = device.index if isinstance(device, torch.device) else device
        if str(index) not in allowed and str(device) not in allowed:
            raise ValueError(
                f"Only devices {os.environ.get(VISIBLE, 'None')} are available to monarch "
                f"worker, but torch.cuda.set_device({device}) was called"
            )

    check_set_device._monarch_check = True  # type: ignore[attr-defined]
    torch.cuda.set_device = check_set_device
