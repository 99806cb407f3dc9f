"""Distributed tensors: inside ``with proc_mesh.activate():`` torch operations make
``Tensor``s (one shard per proc) recorded here and run by a worker on every proc.

``fetch_shard``/``inspect`` bring a shard back, ``remote`` runs a function on every proc,
``Tensor.reduce`` moves data between procs with torch.distributed (gloo on CPU). Upstream's
top-level names (``monarch.Tensor``, ``monarch.fetch_shard``, ...) resolve here.
"""

# torch itself first, before any torch submodule: a proc may be importing torch on another
# thread (an actor's unpickling) when this wheel's worker arrives, and importing a submodule
# of a half-imported torch takes that submodule's import lock ahead of torch's own import,
# a deadlock Python breaks by failing one of the two imports.
from importlib import import_module as _import_module
from types import ModuleType as _ModuleType

import torch  # noqa: F401

from monarch.core import Future

from ._coalescing import coalescing
from ._errors import RemoteException
from ._fetch import call_on_shard_and_fetch, fetch_shard, inspect, show
from ._grad import grad_function, grad_generator
from ._group import RemoteProcessGroup, process_group
from ._mesh import activate, get_active_mesh, no_mesh
from ._pipe import Pipe, create_pipe, remote_generator
from ._remote import Remote, function_resolvers, rank_tensor, rank_tensors, remote
from ._rref import rref as _rref  # noqa: F401 - loaded with the package (workers unpickle it)
from ._stream import Borrow, Stream, get_active_stream
from ._tensor import Tensor, reduce, reduce_, slice_mesh, to_mesh
from ._to_mesh import MeshSliceTensor
from ._unsupported import Simulator, python_local_mesh, set_meta, world_mesh
from ._worker import OpaqueRef

__all__ = [
    "Borrow",
    "Future",
    "MeshSliceTensor",
    "OpaqueRef",
    "Pipe",
    "Remote",
    "RemoteException",
    "RemoteProcessGroup",
    "Simulator",
    "Stream",
    "Tensor",
    "activate",
    "call_on_shard_and_fetch",
    "coalescing",
    "create_pipe",
    "fetch_shard",
    "function_resolvers",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "no_mesh",
    "process_group",
    "python_local_mesh",
    "rank_tensor",
    "rank_tensors",
    "reduce",
    "reduce_",
    "remote",
    "remote_generator",
    "set_meta",
    "show",
    "slice_mesh",
    "to_mesh",
    "world_mesh",
]

_MODULES = {"timer": "monarch.timer", "builtins": "monarch.builtins"}


def __getattr__(name: str) -> _ModuleType:
    """``monarch.timer`` and ``monarch.builtins`` (the core's lazy names find them here): the
    modules, imported on first use (they import this one)."""
    if name in _MODULES:
        return _import_module(_MODULES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
