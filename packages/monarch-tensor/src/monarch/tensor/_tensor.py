"""``monarch.Tensor``: a handle to one shard per proc, with only its metadata here.

Every torch function on it (and every factory inside ``activate()``, through a
``TorchFunctionMode``) is run twice: here on meta tensors, which gives the result's shape,
dtype and aliasing without data (and raises a shape error at the line that made it), and on
each worker, recorded as a command. An in-place op returns its input, as torch's do; a
pure metadata query (``t.shape``, ``t.dim()``) is answered here and sends nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, get_args

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from monarch.core import ActorMesh, calling_endpoint, calling_target, proc_addresses

from ._active import current_client, pushed
from ._client import MeshClient, coalesced
from ._collective import Reduction
from ._commands import Borrowed, Lend, Op, Reduce, Ref, wire_func
from ._flat import flatten, flatten_call, unflatten
from ._group import RemoteProcessGroup
from ._inplace import check_inplace
from ._metacache import key_of, lookup, store
from ._metakernels import spare_dynamo
from ._placement import CPU, NOT_A_QUERY, as_move, placed, query
from ._stream import StorageAliases, Stream, check_inputs, get_active_stream, mutated_input
from ._to_mesh import MeshSliceTensor, select
from ._worker import LENT_WAIT, lent

_PURE_METHODS = frozenset(
    {
        "size",
        "dim",
        "stride",
        "numel",
        "nelement",
        "element_size",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "__len__",
        "storage_offset",
        "ndimension",
        "get_device",
        "__format__",
        "__repr__",
        "__str__",
        "__dir__",
    }
)


class Tensor(torch.Tensor):
    """A tensor of a mesh: one local shard on every proc, created by torch ops inside
    ``mesh.activate()``; ``fetch_shard`` brings a shard's value here."""

    _meta: torch.Tensor
    _ref: int
    _client: MeshClient
    _stream: Stream
    _aliases: StorageAliases
    _device: torch.device
    """Where the shards are on the workers (``_placement``)."""

    @staticmethod
    def _wrap(
        meta: torch.Tensor,
        client: MeshClient,
        aliases: StorageAliases | None = None,
        device: torch.device = CPU,
    ) -> Tensor:
        tensor: Tensor = torch.Tensor._make_wrapper_subclass(
            Tensor,
            meta.size(),
            strides=meta.stride(),
            storage_offset=meta.storage_offset(),
            dtype=meta.dtype,
            device=device,
        )
        tensor._meta = meta
        tensor._device = device
        tensor._ref = client.new_id()
        tensor._client = client
        tensor._stream = get_active_stream()
        tensor._aliases = StorageAliases() if aliases is None else aliases
        tensor._aliases.tensors.add(tensor)
        weakref.finalize(tensor, client.free, tensor._ref)
        return tensor

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return dispatch(func, args, kwargs or {}, None)

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        raise RuntimeError(f"monarch.Tensor reached torch's dispatcher with {func}: not supported")

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        meta = self._meta
        return (
            f"monarch.Tensor(shape={tuple(meta.shape)}, dtype={meta.dtype}, "
            f"mesh={dict(zip(self._client.labels, self._client.sizes, strict=True))})"
        )

    def __str__(self) -> str:
        return self.__repr__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        """In an actor endpoint's arguments, the receiving proc's shard (the worker lends
        it to the call, in order with the commands before it); refused anywhere else."""
        if calling_endpoint() is None or coalesced.sending:
            raise TypeError(
                "a monarch.Tensor cannot be pickled, only passed to an actor endpoint (each "
                "actor gets its proc's shard): fetch_shard it for its value"
            )
        client = self._client
        _check_target(client, calling_target())
        key = client.transfer_key()
        client.record(Lend(self._ref, key))
        client.flush(now=True)
        client.settle_actor_calls(LENT_WAIT)
        return (lent, (key,))

    def slice_mesh(self, **coords: int | slice) -> MeshSliceTensor[Tensor]:
        """The shards on a slice of this tensor's mesh (an int drops that dimension, a
        slice keeps it), to be moved with ``.to_mesh(mesh)``."""
        return MeshSliceTensor(self, select(self._client, coords))

    def to_mesh(self, mesh: Any) -> Tensor:
        """A copy of this tensor on ``mesh``, shard by shard: dimensions match by name and
        size; a dimension only ``mesh`` has gets the same shard along it."""
        moved: Tensor = self.slice_mesh().to_mesh(mesh)
        return moved

    def _borrowed_by(self, stream: Stream, aliases: StorageAliases) -> Tensor:
        """The tensor of a borrow (``Stream.borrow``): on ``stream``, naming this tensor's
        shard itself on the workers."""
        meta = self._meta
        with pushed(None):
            fresh = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device="meta")
        with stream.activate():
            r = Tensor._wrap(fresh, self._client, aliases, self._device)
        # On the borrowing stream: it waits there for the lender's commands so far.
        self._client.record(Borrowed(r._ref, self._ref), stream)
        return r

    def reduce(self, dims: str | Any, reduction: str = "sum", scatter: bool = False) -> Tensor:
        """Reduce across the procs along mesh dimension(s) ``dims`` (torch.distributed)."""
        return _reduce(self, dims, reduction, scatter, inplace=False)

    def reduce_(self, dims: str | Any, reduction: str = "sum", scatter: bool = False) -> Tensor:
        """``reduce`` in place: every proc's shard becomes the reduced value."""
        return _reduce(self, dims, reduction, scatter, inplace=True)


def reduce(tensor: Tensor, dims: object, reduction: str = "sum", scatter: bool = False) -> Tensor:
    """``tensor.reduce(dims, reduction, scatter)`` (upstream's ``monarch.reduce``)."""
    return tensor.reduce(dims, reduction, scatter)


def reduce_(tensor: Tensor, dims: object, reduction: str = "sum", scatter: bool = False) -> Tensor:
    """``tensor.reduce_(dims, reduction, scatter)``."""
    return tensor.reduce_(dims, reduction, scatter)


def dispatch(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    client: MeshClient | None,
    meta_func: Callable[..., Any] | None = None,
    wire: Any = None,
    factory: bool = False,
    needs_data: type[Exception] | None = None,
) -> Any:
    """Record ``func(*args, **kwargs)`` on the mesh of its monarch Tensors (or ``client``,
    for a factory) and return its result as monarch Tensors, computed without data.
    ``needs_data``: raised (from the error) where running it on meta tensors fails, as an
    op whose result depends on the values does, before anything is recorded."""
    flat, spec = flatten_call(args, kwargs)
    clients = {x._client for x in flat if isinstance(x, Tensor)}
    if len(clients) > 1:
        raise ValueError("an operation mixes monarch Tensors of different meshes")
    if clients:
        client = clients.pop()
    if client is None:
        raise RuntimeError("no active mesh: use `with proc_mesh.activate():`")
    tensors = [x for x in flat if isinstance(x, Tensor)]
    if tensors and _pure(func):
        known = query(func, tensors[0]._device)
        if known is not NOT_A_QUERY:
            return known
    move = as_move(func, args, kwargs, tensors[0]._device) if tensors else None
    if move is not None:
        func, args, kwargs = move
        flat, spec = flatten_call(args, kwargs)
    device = placed(kwargs, [x._device for x in tensors])
    if not _pure(func):  # metadata (t.shape) is the controller's: any stream may read it
        written = mutated_input(func, args, kwargs)
        check_inputs(func, tensors, written if isinstance(written, Tensor) else None)
    inputs = {id(x._meta): x for x in tensors}
    key = None if meta_func is not None else key_of(func, args, kwargs, flat)
    with pushed(None):  # fresh meta tensors, even where a remote call leaves the mode on
        cached = None if key is None else lookup(key)
    if cached is not None:
        out_spec, leaves = cached
    else:
        spare_dynamo()  # else torch's meta kernels import torch._dynamo (~1 s) at first use
        meta_args, meta_kwargs = unflatten([_to_meta(x) for x in flat], spec)
        if "device" in meta_kwargs:
            meta_kwargs["device"] = "meta"
        with pushed(None), torch.device("meta"):
            try:
                result = (meta_func or func)(*meta_args, **meta_kwargs)
                if meta_func is None:
                    check_inplace(func, meta_args, meta_kwargs)
            except (NotImplementedError, RuntimeError) as exc:
                if needs_data is None:
                    raise
                raise needs_data(exc) from exc
        leaves, out_spec = flatten(result)
        if key is not None:
            store(key, out_spec, leaves, set(inputs))
    if factory and not any(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return func(*args, **kwargs)  # no tensor made: not a factory, run it here
    out: list[Any] = []
    ids: list[int] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            # An input returned by ``func`` itself on meta tensors is that input (an in-place
            # op's result). One returned by a declared ``meta_func`` (a propagate) only says
            # the result's shape: the result is a new tensor, as upstream's, which may alias
            # the input's storage (if the function returns it on the worker).
            tensor = inputs.get(id(leaf)) if meta_func is None else None
            if tensor is None:  # a view of an input shares its storage's rights
                if id(leaf) in inputs:
                    leaf = leaf.view_as(leaf)  # its own metadata, the input's storage
                roots = {id(_root(x._meta)): x._aliases for x in tensors}
                tensor = Tensor._wrap(leaf, client, roots.get(id(_root(leaf))), device)
            out.append(tensor)
            ids.append(tensor._ref)
        elif isinstance(leaf, torch.device) and leaf.type == "meta":
            out.append(device)
        else:
            out.append(leaf)
    if ids or not _pure(func):
        wire_args, wire_kwargs = unflatten([_to_wire(x) for x in flat], spec)
        grad = torch.is_grad_enabled()
        sent = wire_func(func) if wire is None else wire
        client.record(Op(func=sent, args=wire_args, kwargs=wire_kwargs, grad=grad, out=tuple(ids)))
    return unflatten(out, out_spec)


def _root(meta: torch.Tensor) -> torch.Tensor:
    base = meta._base
    return meta if base is None else base


def _to_meta(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x._meta
    if isinstance(x, RemoteProcessGroup):
        return x.fake()
    if isinstance(x, torch.Tensor):
        return x.to("meta")
    if isinstance(x, torch.device):  # a device given by position (``t.to(other.device)``)
        return _META
    return x


_META = torch.device("meta")


def _to_wire(x: Any) -> Any:
    return Ref(x._ref) if isinstance(x, Tensor) else x


def _pure(func: Any) -> bool:
    """Whether ``func`` only reads metadata (so the workers need not run it)."""
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":
        return bool(func.__name__ == "__get__")
    return getattr(func, "__name__", None) in _PURE_METHODS


class ActiveMode(TorchFunctionMode):
    """Inside ``activate()``: factories (no tensor argument) make monarch Tensors too."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        client = current_client()
        flat = flatten_call(args, kwargs)[0]
        if any(isinstance(x, Tensor) for x in flat):
            return dispatch(func, args, kwargs, client)
        if client is None or any(isinstance(x, torch.Tensor) for x in flat):
            return func(*args, **kwargs)  # local tensors stay local
        return dispatch(func, args, kwargs, client, factory=True)


REDUCTIONS: tuple[Reduction, ...] = get_args(Reduction)


def _reduce(tensor: Tensor, dims: Any, reduction: str, scatter: bool, inplace: bool) -> Tensor:
    """Record a collective: every worker runs it with its peers along ``dims`` (gloo)."""
    client = tensor._client
    check_inputs("reduce_" if inplace else "reduce", [tensor], tensor if inplace else None)
    names = [dims] if isinstance(dims, str) else list(dims)
    unknown = [d for d in names if d not in client.labels]
    if unknown or not names:
        raise ValueError(f"reduce over {names!r}: the mesh has dimensions {client.labels}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, not {reduction!r}")
    axes = tuple(sorted({client.labels.index(d) for d in names}))
    size = 1
    for axis in axes:
        size *= client.sizes[axis]
    meta = tensor._meta
    with pushed(None):
        if reduction == "stack":
            if inplace or scatter:
                raise ValueError("reduction='stack' makes a new tensor: no reduce_ nor scatter")
            result = torch.empty((size, *meta.shape), dtype=meta.dtype, device="meta")
        elif reduction == "avg" and not (meta.is_floating_point() or meta.is_complex()):
            raise TypeError(f"reduction='avg' needs a floating point tensor, not {meta.dtype}")
        elif meta.is_contiguous():
            # Not empty_like: torch's meta kernel of it imports sympy, a second or so the
            # first time in a process (a program's first reduce, on a fresh client).
            result = torch.empty(meta.shape, dtype=meta.dtype, device="meta")
        else:
            result = torch.empty_like(meta)
        if scatter:
            if inplace:
                raise ValueError("scatter=True changes the shape: use reduce, not reduce_")
            if meta.dim() == 0 or meta.shape[0] % size:
                raise ValueError(
                    f"scatter needs dimension 0 ({tuple(meta.shape)}) divisible by {size}"
                )
            result = torch.empty(
                (meta.shape[0] // size, *meta.shape[1:]), dtype=meta.dtype, device="meta"
            )
    out = tensor if inplace else Tensor._wrap(result, client, device=tensor._device)
    client.record(Reduce(out._ref, tensor._ref, axes, reduction, scatter, client.store()))
    return out


def slice_mesh(tensors: Any, **coords: int | slice) -> Any:
    """``t.slice_mesh(**coords)`` of every monarch Tensor in a pytree (upstream's
    ``monarch.slice_mesh``)."""
    return tree_map(lambda t: _tensor(t).slice_mesh(**coords), tensors)


def to_mesh(tensors: Any, mesh: Any) -> Any:
    """``t.to_mesh(mesh)`` of every monarch Tensor (or ``MeshSliceTensor``) in a pytree
    (upstream's ``monarch.to_mesh``)."""

    def one(t: Any) -> Any:
        if isinstance(t, MeshSliceTensor):
            return t.to_mesh(mesh)
        return _tensor(t).to_mesh(mesh)

    return tree_map(one, tensors, is_leaf=lambda x: isinstance(x, MeshSliceTensor))


def _tensor(t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"expected a monarch.Tensor, not {type(t).__name__}")
    return t


def _check_target(client: MeshClient, target: object) -> None:
    """A shard reaches only an actor on a proc of the tensor's mesh: calling one elsewhere
    is refused at the call (its proc would wait for a shard that never comes)."""
    if not isinstance(target, ActorMesh):
        return
    called = proc_addresses(target)
    ours = proc_addresses(client.workers())
    if called is None or ours is None:
        return  # procs still starting: the actor's proc says so if it gets no shard
    outside = called - ours
    if outside:
        raise TypeError(
            f"a monarch.Tensor passed to {target._name!r}, whose actors on "
            f"{len(outside)} proc(s) are not on the tensor's mesh: an actor takes a "
            "monarch.Tensor only on the procs of the tensor's mesh (fetch_shard it, or "
            "move it with to_mesh)"
        )
