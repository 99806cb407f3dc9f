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
import torch  # noqa: F401

from monarch.core import Future

from ._coalescing import coalescing
from ._errors import RemoteException
from ._fetch import call_on_shard_and_fetch, fetch_shard, inspect, show
from ._group import RemoteProcessGroup, process_group
from ._mesh import activate, get_active_mesh, no_mesh
from ._remote import Remote, rank_tensor, rank_tensors, remote
from ._rref import rref as _rref  # noqa: F401 - loaded with the package (workers unpickle it)
from ._stream import Borrow, Stream, get_active_stream
from ._tensor import Tensor, reduce, reduce_, slice_mesh, to_mesh
from ._to_mesh import MeshSliceTensor

__all__ = [
    "Borrow",
    "Future",
    "MeshSliceTensor",
    "Remote",
    "RemoteException",
    "RemoteProcessGroup",
    "Stream",
    "Tensor",
    "activate",
    "call_on_shard_and_fetch",
    "coalescing",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "inspect",
    "no_mesh",
    "process_group",
    "rank_tensor",
    "rank_tensors",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
]
