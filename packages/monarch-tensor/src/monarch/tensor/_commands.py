"""What the controller streams to the workers: one msgspec Struct per engine command.

Each command says which tensor ids it reads and writes (``reads()``, ``writes()``: what
orders it between streams and what its failure poisons) and what a worker does for it
(``run(worker)``). ``Command`` is their tagged union; the controller builds each kind in one
place and batches them (``MeshClient.record``), the worker takes a batch through ``decode``
alone. A batch travels in the core's pickle (functions, local tensors and user objects ride
in ``Op``/``Call`` arguments), one message per batch.

A command names tensors by integer id (``Ref``); the worker holds one local shard per id.
Functions travel by reference (torch's own, or the user's through cloudpickle, ``Pickled``);
a tensor attribute (``t.shape``, ``t.grad = x``) is a getset descriptor, which pickle cannot
reach, so it travels as ``Attr``.

To add an engine command: a Struct here with its fields, ``reads``/``writes`` and ``run``,
added to ``Command``; the controller records it with ``client.record(YourCommand(...))``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, Union, get_args

import msgspec
import torch

from monarch.core import ActorMesh

from ._collective import COLLECTIVE_TIMEOUT, Group, Reduction, any_failed, collective
from ._errors import CommandError, Failed, Poison, RemoteException
from ._flat import flatten, flatten_call
from ._inbox import deliver, take

Ids = tuple[int, ...]


class Worker(Protocol):
    """What a command's ``run`` may use of the proc's engine (``_worker.TensorWorker``, which
    runs the commands of this module): the ids' values and the helpers they share."""

    env: dict[int, object]

    @property
    def rank(self) -> int: ...

    def held(self, ref: int, op: str) -> object: ...

    def apply(
        self, func: object, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool
    ) -> Any: ...

    def function(self, func: object, load: bool = True) -> object: ...

    def poison(self, out: Iterable[int], op: str, exc: BaseException) -> None: ...

    def group(self, dims: tuple[int, ...], store: tuple[str, int]) -> Group: ...


class Ref(msgspec.Struct, frozen=True, array_like=True):
    """A tensor by id inside a command's arguments (a leaf for torch's pytree, which a
    NamedTuple would not be)."""

    id: int


class GroupRef(msgspec.Struct, frozen=True, array_like=True):
    """A ``RemoteProcessGroup`` inside a command's arguments: the worker gives the function
    its gloo group along mesh dimensions ``dims`` (indices), met at ``store``."""

    dims: Ids
    store: tuple[str, int]


class Attr(msgspec.Struct, frozen=True, array_like=True):
    """``getattr``/``setattr`` of a tensor attribute, as a picklable callable."""

    name: str
    set: bool

    def __call__(self, obj: object, *value: object) -> object:
        if self.set:
            setattr(obj, self.name, value[0])
            return None
        return getattr(obj, self.name)


class Pickled(msgspec.Struct, frozen=True, array_like=True):
    """A user's function pickled at the controller and unpickled by the worker inside the
    op, so that one it cannot import (a module missing there) poisons that op's outputs
    instead of failing the whole batch."""

    name: str
    parts: list[bytes]


class Shaped(msgspec.Struct, frozen=True, array_like=True):
    """A function whose results' shapes the controller took from the first proc's run (a
    ``"cached"`` propagation): each worker checks that its own results have them."""

    func: Pickled
    shapes: list[tuple[Ids, str]]
    """Each tensor result's shape and dtype, in the order of the result's leaves."""


Function = Union[Callable[..., Any], Pickled, Shaped]  # noqa: UP007
"""What an ``Op`` runs: a torch function (or an ``Attr``), a user's, or a checked one."""


class _Base(msgspec.Struct, frozen=True, tag=True, array_like=True):
    """A command: the ids it reads and writes, and what a worker does for it (``run``)."""

    def reads(self) -> Ids:
        return ()

    def writes(self) -> Ids:
        return ()

    def run(self, worker: Worker) -> None:
        """Run on ``worker``'s stream thread; an exception poisons ``writes()``."""


class _Applies(_Base, frozen=True):
    """A function called on each proc with its shards for the ``Ref`` in its arguments, in
    the recorded grad mode."""

    func: Function
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    grad: bool

    def reads(self) -> Ids:
        return tuple(
            leaf.id for leaf in flatten_call(self.args, self.kwargs)[0] if isinstance(leaf, Ref)
        )


class Op(_Applies, frozen=True):
    """A torch function (or a remote function with tensor results) on each proc's shards:
    its tensor results, in order, become ids ``out``."""

    out: Ids

    def writes(self) -> Ids:
        return self.out

    def run(self, worker: Worker) -> None:
        func: Function = self.func
        try:
            shapes = None
            if isinstance(func, Shaped):
                shapes = func.shapes
                func = func.func
            result = worker.apply(func, self.args, self.kwargs, self.grad)
            tensors = [x for x in flatten(result)[0] if isinstance(x, torch.Tensor)]
            if len(tensors) != len(self.out):
                raise TypeError(
                    f"returned {len(tensors)} tensors where the controller expected {len(self.out)}"
                )
            if shapes is not None:
                _check_shapes(tensors, shapes)
        except Failed as failed:
            for ref in self.out:
                worker.env[ref] = failed.poison
            return
        except Exception as exc:  # noqa: BLE001 - poisons the outputs, raised at their fetch
            worker.poison(self.out, op_name(worker.function(func, load=False)), exc)
            return
        for ref, tensor in zip(self.out, tensors, strict=True):
            worker.env[ref] = tensor


class Call(_Applies, frozen=True):
    """A remote function's adverb call (``fn.call``, ``fn.broadcast``...): its result,
    whatever it is, held at ``out``."""

    out: int

    def writes(self) -> Ids:
        return (self.out,)

    def run(self, worker: Worker) -> None:
        try:
            worker.env[self.out] = worker.apply(self.func, self.args, self.kwargs, self.grad)
        except Failed as failed:
            worker.env[self.out] = failed.poison
        except Exception as exc:  # noqa: BLE001 - poisons the result, raised at its fetch
            worker.poison((self.out,), op_name(worker.function(self.func, load=False)), exc)


class Borrowed(_Base, frozen=True):
    """A stream's borrow (``Stream.borrow``): id ``out`` names the lender's shard itself."""

    out: int
    source: int

    def reads(self) -> Ids:
        return (self.source,)

    def writes(self) -> Ids:
        return (self.out,)

    def run(self, worker: Worker) -> None:
        value = worker.held(self.source, "borrow")
        worker.env[self.out] = Poison(value) if isinstance(value, RemoteException) else value


class Reduce(_Base, frozen=True):
    """A collective over mesh dimensions ``dims`` (indices) of ``source`` into ``out``
    (``out == source``: in place), the gloo group met at the controller's ``store``."""

    out: int
    source: int
    dims: Ids
    reduction: Reduction
    scatter: bool
    store: tuple[str, int]

    def reads(self) -> Ids:
        return (self.source,)

    def writes(self) -> Ids:
        return (self.out,)

    def run(self, worker: Worker) -> None:
        op = f"reduce({self.reduction})"
        try:
            group = worker.group(self.dims, self.store)
            value = worker.held(self.source, op)
            failed = isinstance(value, RemoteException)
            # Every rank takes part even with a failed input: all poison the output.
            if any_failed(group, failed):
                own = value if isinstance(value, RemoteException) else None
                why = own or RemoteException(op, worker.rank, "an input of the reduction failed")
                worker.env[self.out] = Poison(why)
                return
            assert isinstance(value, torch.Tensor)
            inplace = self.out == self.source
            worker.env[self.out] = collective(value, group, self.reduction, self.scatter, inplace)
        except Exception as exc:  # noqa: BLE001 - poisons the output, raised at its fetch
            worker.poison((self.out,), op, exc)


class Send(_Base, frozen=True):
    """``to_mesh``, the source's side: this rank's shard of ``source`` (or the error it
    holds: the receivers are poisoned alike) to the inbox of each destination ``plan`` names
    for it (destination coordinates by source rank)."""

    source: int
    key: str
    plan: dict[int, list[dict[str, int]]]
    inbox: ActorMesh[Any]

    def reads(self) -> Ids:
        return (self.source,)

    def run(self, worker: Worker) -> None:
        targets = self.plan.get(worker.rank)
        if not targets:
            return
        value = worker.held(self.source, "to_mesh")
        if isinstance(value, torch.Tensor):
            value = value.detach()
        for coords in targets:
            self.inbox.slice(**coords).put.broadcast(self.key, value)


class Recv(_Base, frozen=True):
    """``to_mesh``, the destination's side: wait for the shard a ``Send`` sends here."""

    out: int
    key: str

    def writes(self) -> Ids:
        return (self.out,)

    def run(self, worker: Worker) -> None:
        try:
            value = take(self.key, COLLECTIVE_TIMEOUT.total_seconds())
        except TimeoutError as exc:
            worker.poison((self.out,), "to_mesh", exc)
            return
        if isinstance(value, RemoteException):
            worker.env[self.out] = Poison(value)
        else:
            worker.env[self.out] = value.contiguous()


class Lend(_Base, frozen=True):
    """A monarch Tensor in an actor call's arguments: hand the shard itself (or the error
    it holds) to this proc's actor, whose unpickling waits at slot ``key``."""

    source: int
    key: str

    def reads(self) -> Ids:
        return (self.source,)

    def run(self, worker: Worker) -> None:
        deliver(self.key, worker.held(self.source, "actor call"))


class Delete(_Base, frozen=True):
    """Ids the controller dropped (routed to the stream that wrote each, see the worker)."""

    ids: Ids

    def run(self, worker: Worker) -> None:
        for ref in self.ids:
            worker.env.pop(ref, None)


class UseStream(_Base, frozen=True):
    """The commands after it (this batch and later ones) are stream ``stream``'s."""

    stream: int


class Wait(_Base, frozen=True):
    """The current stream waits for stream ``stream``'s commands recorded so far (a
    dropped borrow: the lender waits for the borrower)."""

    stream: int


Command = Union[Op, Call, Borrowed, Reduce, Send, Recv, Lend, Delete, UseStream, Wait]  # noqa: UP007
"""Every engine command (a msgspec tagged union: each encodes as ``[name, fields...]``)."""

KINDS: tuple[type[_Base], ...] = get_args(Command)
_KINDS = frozenset(KINDS)


def decode(batch: object) -> list[Command]:
    """A batch as the worker's ``run`` endpoint received it, checked: a list of commands,
    or ``CommandError`` saying what else it holds."""
    if type(batch) is not list:
        raise CommandError(
            f"a tensor-engine batch is a list of commands, not {type(batch).__name__}"
        )
    for i, command in enumerate(batch):
        if type(command) not in _KINDS:
            raise CommandError(
                f"item {i} of a tensor-engine batch is {_describe(command)}, not one of the "
                f"commands {', '.join(kind.__name__ for kind in KINDS)} (a controller of "
                "another version of monarch-tensor?)"
            )
    commands: list[Command] = batch
    return commands


def _describe(value: object) -> str:
    text = repr(value)
    return f"a {type(value).__name__} ({text[:80]}{'...' if len(text) > 80 else ''})"


def wire_func(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` as it can be pickled: attribute descriptors become ``Attr``."""
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor" and func.__name__ in ("__get__", "__set__"):
        return Attr(owner.__name__, func.__name__ == "__set__")  # type: ignore[union-attr]
    return func


def op_name(func: object) -> str:
    """How a failure names the operation: ``torch.add``, ``Tensor.add_``, ``my_fn``."""
    if isinstance(func, Attr):
        return f"Tensor.{func.name}"
    if isinstance(func, Pickled):
        return func.name
    if isinstance(func, Shaped):
        return op_name(func.func)
    owner = getattr(func, "__self__", None)
    if type(owner).__name__ == "getset_descriptor":
        return f"Tensor.{owner.__name__}"  # type: ignore[union-attr]
    qualname = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    qualname = qualname.replace("_VariableFunctionsClass.", "torch.")
    qualname = qualname.replace("TensorBase.", "Tensor.")
    return qualname


def _check_shapes(tensors: list[torch.Tensor], shapes: list[tuple[Ids, str]]) -> None:
    """A ``"cached"`` propagation's results must have, on every proc, the first proc's
    shapes and dtypes (the controller's tensors have them): else the op fails here."""
    for i, (tensor, (shape, dtype)) in enumerate(zip(tensors, shapes, strict=True)):
        mine = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        if mine != (tuple(shape), dtype):
            raise ValueError(
                f"result {i} is {mine[1]}{list(mine[0])} here but {dtype}{list(shape)} on the "
                "first proc, whose run said the shapes (propagate='cached'): every proc's "
                "results must have the first proc's shapes; give propagate= a function instead"
            )
