"""The tensor engine ``patch_tensor_engine`` gives an actor by default (upstream's is its
GPU simulator): this engine on the actor's proc mesh, with every CUDA device run on the
procs' CPUs, so a program written for GPUs runs, and computes real values, without one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from monarch.core import ProcMesh

from ._mesh import activate_engine
from ._placement import default_is_cuda


def _on_cpu(device: Any) -> Any:
    """``device`` with CUDA replaced by the CPU; anything else as it is."""
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
        return torch.device("cpu")
    if isinstance(device, int):  # a CUDA ordinal, as in ``t.to(0)``
        return torch.device("cpu")
    return device


class CpuForCuda(TorchFunctionMode):
    """Torch calls with CUDA devices (given, or the default device) made on the CPU."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        made = func in _device_constructors() and kwargs.get("device") is None
        if made and default_is_cuda():
            kwargs["device"] = torch.device("cpu")  # what set_default_device("cuda") adds
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], _on_cpu(args[1]), *args[2:])
        return func(*args, **kwargs)


class SimulatedEngine:
    """What ``factory(proc_mesh)`` returns: its ``activate()`` is the mocked actor's."""

    def __init__(self, proc_mesh: ProcMesh) -> None:
        self.proc_mesh = proc_mesh

    @contextmanager
    def activate(self) -> Iterator[ProcMesh]:
        with activate_engine(self.proc_mesh) as mesh, CpuForCuda():
            yield mesh
