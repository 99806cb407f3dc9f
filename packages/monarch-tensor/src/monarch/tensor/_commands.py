"""What the controller streams to the workers: plain tuples, pickled once per batch.

A command names tensors by integer id (``Ref``); the worker holds one local shard per id.
Functions travel by reference (torch's own, or the user's through cloudpickle); a tensor
attribute (``t.shape``, ``t.grad = x``) is a getset descriptor, which pickle cannot reach,
so it travels as ``Attr``.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Ref:
    """A tensor by id inside a command's arguments (a leaf for torch's pytree, which a
    NamedTuple would not be)."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __reduce__(self) -> tuple[type[Ref], tuple[int]]:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class GroupRef:
    """A ``RemoteProcessGroup`` inside a command's arguments: the worker gives the function
    its gloo group along mesh dimensions ``dims`` (indices), met at ``store``."""

    __slots__ = ("dims", "store")

    def __init__(self, dims: tuple[int, ...], store: tuple[str, int]) -> None:
        self.dims = dims
        self.store = store

    def __reduce__(self) -> tuple[type[GroupRef], tuple[tuple[int, ...], tuple[str, int]]]:
        return (GroupRef, (self.dims, self.store))

    def __repr__(self) -> str:
        return f"GroupRef({self.dims})"


class Attr(NamedTuple):
    """``getattr``/``setattr`` of a tensor attribute, as a picklable callable."""

    name: str
    set: bool

    def __call__(self, obj: Any, *value: Any) -> Any:
        if self.set:
            setattr(obj, self.name, value[0])
            return None
        return getattr(obj, self.name)


class Pickled:
    """A user's function pickled at the controller and unpickled by the worker inside the
    op, so that one it cannot import (a module missing there) poisons that op's outputs
    instead of failing the whole batch."""

    __slots__ = ("name", "parts")

    def __init__(self, name: str, parts: list[bytes]) -> None:
        self.name = name
        self.parts = parts

    def __reduce__(self) -> tuple[type[Pickled], tuple[str, list[bytes]]]:
        return (Pickled, (self.name, self.parts))


class Shaped:
    """A function whose results' shapes the controller took from the first proc's run (a
    ``"cached"`` propagation): each worker checks that its own results have them."""

    __slots__ = ("func", "shapes")

    def __init__(self, func: Any, shapes: list[tuple[tuple[int, ...], str]]) -> None:
        self.func = func
        self.shapes = shapes
        """Each tensor result's shape and dtype, in the order of the result's leaves."""

    def __reduce__(self) -> tuple[type[Shaped], tuple[Any, list[tuple[tuple[int, ...], str]]]]:
        return (Shaped, (self.func, self.shapes))


def wire_func(func: Any) -> Any:
    """``func`` as it can be pickled: attribute descriptors become ``Attr``."""
    owner: Any = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor" and func.__name__ in ("__get__", "__set__"):
        return Attr(owner.__name__, func.__name__ == "__set__")
    return func


def op_name(func: Any) -> str:
    """How a failure names the operation: ``torch.add``, ``Tensor.add_``, ``my_fn``."""
    if isinstance(func, Attr):
        return f"Tensor.{func.name}"
    if isinstance(func, Pickled):
        return func.name
    if isinstance(func, Shaped):
        return op_name(func.func)
    owner: Any = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":
        return f"Tensor.{owner.__name__}"
    qualname = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    qualname = qualname.replace("_VariableFunctionsClass.", "torch.")
    qualname = qualname.replace("TensorBase.", "Tensor.")
    return qualname


# Command tags (first element of each command tuple).
OP = 0  # (OP, out_ids, func, args, kwargs, grad enabled)
DELETE = 1  # (DELETE, ids)
REDUCE = 2  # (REDUCE, out_id, in_id, dims, reduction, scatter, store, meta)
SEND = 3  # (SEND, in_id, key, {rank: destination coords...}, destination inbox mesh)
RECV = 4  # (RECV, out_id, key)
LEND = 5  # (LEND, in_id, key): the shard to this proc's actor that an endpoint call names
CALL = 6  # (CALL, out_id, func, args, kwargs, grad enabled): a remote function's adverb call
STREAM = 7  # (STREAM, stream id): the commands after it (this batch and later) are that stream's
WAIT = 8  # (WAIT, stream id): the current stream waits for that one's commands recorded so far


def same(x: Any) -> Any:
    """The worker's side of a borrow: the borrowed id names the lender's shard itself."""
    return x
