"""The worker: one actor per proc holding one local shard per tensor id.

It runs each stream's commands in the order they were recorded (the streams at once, each
on its thread, ordered between them where they share a tensor: see ``_lanes``, ``run``
and ``_needs``); what each command does is its ``run`` (``_commands``). A failing command
never raises out of the endpoint (a broadcast's failure has nobody to tell): its outputs
become ``Poison``, and every later command reading a poisoned id poisons its own outputs, so
exactly the dependents fail, at the fetch that asks for them.

Everything a proc unpickles by reference from this package outside a command lives here
(the worker, the inbox, ``lent``, ``OpaqueRef``): a proc unpickling objects of two modules
of one package on two threads at once (a user's actor call beside the worker's spawn) can
deadlock in the import system.
"""

from __future__ import annotations

import functools
import itertools
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._pytree import register_pytree_node
from torch.utils.weak import WeakTensorKeyDictionary

from monarch.core import Actor, Point, begin_operation, context, endpoint, instrumented, loads

from ._collective import Group, Groups
from ._commands import Command, Delete, GroupRef, Pickled, Ref, Shaped, UseStream, Wait, decode
from ._devices import take_device
from ._errors import Failed, Poison, RemoteException
from ._flat import flatten, flatten_call, unflatten
from ._inbox import deliver, take
from ._lanes import Lane, Needs, settled

LENT_WAIT = 120.0
"""Seconds an actor call waits for the shard it was given (its worker may be busy)."""


class TensorWorker(Actor):
    """The tensor engine of one proc (spawned by the controller on first use of a mesh).

    What a command does is its ``run`` (``_commands``); the worker holds what they share:
    the ids' values (``env``), the streams and the gloo groups."""

    def __init__(self) -> None:
        me = context().actor_instance
        take_device(me.rank, me.proc_id)
        self.env: dict[int, object] = {}
        """Each id's local shard (a remote function's result, for a ``Call``) or ``Poison``."""
        self._point: Point | None = None
        self._groups = Groups()
        self._functions: dict[tuple[bytes, ...], Callable[..., Any]] = {}
        self._batches = 0
        self._changed = threading.Condition()
        self._lanes: dict[int, Lane] = {}
        self._current = 0
        """The stream the commands of the next batch are for (a ``UseStream`` says)."""
        self._streams = False
        """Whether a stream other than ``main`` has had commands (then each is routed)."""
        self._writer: dict[int, int] = {}
        """The stream that last wrote each id, where it is not ``main``."""
        self._readers: dict[int, set[int]] = {}
        """The other streams that read each id since it was written."""

    @property
    def rank(self) -> int:
        return self._here().rank

    def _here(self) -> Point:
        """This worker's point in its mesh, as the first ``run`` (sent to all) tells it."""
        if self._point is None:
            self._point = context().message_rank
        return self._point

    @endpoint
    def run(self, commands: list[Command]) -> None:
        """Queue a batch of commands on their streams (fire and forget: failures poison,
        never raise; a batch that is not one raises ``CommandError``). Until a second stream
        appears, the batch runs here, on the actor's thread, as it comes (no thread to hand
        it to, nothing to overlap with)."""
        commands = decode(commands)
        self._here()
        self._batches += 1
        if not self._streams and not any(type(command) is UseStream for command in commands):
            self._execute(0, commands)
            return
        self._streams = True
        lane = self._current
        segment: list[Command] = []
        needs: Needs = []

        def push() -> None:
            if segment or needs:
                self._lane(lane).push(segment, needs)

        for command in commands:
            if isinstance(command, (UseStream, Wait, Delete)):
                push()
                segment, needs = [], []
                if isinstance(command, UseStream):
                    lane = command.stream
                elif isinstance(command, Wait):
                    self._lane(lane).push([], self._now({command.stream}))
                else:
                    self._delete(command.ids)
                continue
            waits = self._needs(lane, command)
            if waits:
                push()
                segment, needs = [], waits
            segment.append(command)
        push()
        self._current = lane

    def _execute(self, sid: int, commands: list[Command]) -> None:
        """Run a segment of stream ``sid``'s commands (on that stream's thread)."""
        running.commands = True
        running.stream = sid
        timed = instrumented()  # telemetry: each command a span
        for command in commands:
            scope = begin_operation("tensor", op_name(command)) if timed else None
            try:
                command.run(self)
            except Exception as exc:  # noqa: BLE001 - a bug here must not fail the actor
                self.poison(command.writes(), f"command {type(command).__name__}", exc)
            if scope is not None:
                scope.close(None)

    # -- streams: which commands wait for which ---------------------------------------------

    def _lane(self, sid: int) -> Lane:
        lane = self._lanes.get(sid)
        if lane is None:
            lane = self._lanes[sid] = Lane(
                sid, functools.partial(self._execute, sid), self._changed
            )
        return lane

    def _now(self, sids: Iterable[int]) -> list[tuple[Lane, int]]:
        """Each of these streams' commands queued so far (what a command after them waits
        for)."""
        return [(lane, lane.pushed) for sid in sids if (lane := self._lanes.get(sid))]

    def _needs(self, sid: int, command: Command) -> list[tuple[Lane, int]]:
        """What ``command``, on stream ``sid``, waits for: the stream that last wrote a
        tensor it reads or writes, and the streams that read one it writes since. (Within
        the rules, only a borrow reads another stream's tensor; actor calls, ``to_mesh``
        and adverbs may, and are ordered alike.)"""
        others: set[int] = set()
        for ref in command.reads():
            writer = self._writer.get(ref, 0)
            if writer != sid:
                others.add(writer)
                self._readers.setdefault(ref, set()).add(sid)
        for ref in command.writes():
            # A new id has no writer, nor has one of main's (not noted): a command writing
            # a tensor it did not make reads it too (in place, ``out=``), which orders it.
            last = self._writer.get(ref)
            if last is not None:
                others.add(last)
            others.update(self._readers.pop(ref, ()))
            if sid:
                self._writer[ref] = sid
            else:
                self._writer.pop(ref, None)
        others.discard(sid)
        return self._now(others)

    def _delete(self, refs: tuple[int, ...]) -> None:
        """Delete each id on the stream that wrote it last, after the other streams' reads."""
        by_writer: dict[int, list[int]] = {}
        after: dict[int, set[int]] = {}
        for ref in refs:
            writer = self._writer.pop(ref, 0)
            by_writer.setdefault(writer, []).append(ref)
            after.setdefault(writer, set()).update(self._readers.pop(ref, ()))
        for writer, gone in by_writer.items():
            waits = after[writer] - {writer}
            self._lane(writer).push([Delete(tuple(gone))], self._now(waits))

    def _settled(self, refs: Iterable[int] | None = None) -> None:
        """Wait until the commands queued so far that write ``refs`` (default: all) ran."""
        sids = self._lanes if refs is None else {self._writer.get(ref, 0) for ref in refs}
        settled(self._changed, self._now(sids))

    @endpoint
    def fetch(self, ids: list[int], rank: int) -> object:
        """The values of ``ids`` here (the controller calls ``rank``'s worker alone), or the
        exception that one of them holds, returned (not raised) so the controller can raise
        it as is. (Not ``_here()``: a sliced call's point is the slice's.) No ``ids`` waits
        for every stream's commands so far (the controller's ``settle_actor_calls``: the
        ``rref`` calls run on their stream's thread)."""
        self._settled(ids or None)
        values = []
        for ref in ids:
            value = self.env.get(ref, _MISSING)
            if value is _MISSING:
                return RemoteException("fetch", rank, f"no tensor with id {ref} on this worker")
            if isinstance(value, Poison):
                return value.error
            values.append(_portable(value))
        return values

    @endpoint
    def batches(self) -> int:
        """How many batches of commands this worker has run (one per controller message)."""
        return self._batches

    @endpoint
    def live_ids(self) -> list[int]:
        """The ids this worker holds (what the controller has not freed), once the commands
        sent so far ran."""
        self._settled()
        return sorted(self.env)

    # -- what the commands share -------------------------------------------------------------

    def held(self, ref: int, op: str) -> object:
        """The value at ``ref``, or the ``RemoteException`` it holds (or says it is missing):
        what a command that passes a shard on (to a peer, an actor) hands over."""
        value = self.env.get(ref, _MISSING)
        if value is _MISSING:
            return RemoteException(op, self.rank, f"no tensor {ref}")
        if isinstance(value, Poison):
            return value.error
        return value

    def apply(self, func: object, args: tuple[Any, ...], kwargs: dict[str, Any], grad: bool) -> Any:
        """``func(*args, **kwargs)`` with each ``Ref`` replaced by its shard (``Failed`` if
        one is poisoned or missing) and grad mode as recorded."""
        loaded = self.function(func)
        assert callable(loaded)
        args, kwargs = self._resolve(args, kwargs)
        with torch.set_grad_enabled(grad):
            return loaded(*args, **kwargs)

    def _resolve(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments with each ``Ref`` replaced by this worker's shard."""

        def one(leaf: object) -> object:
            if isinstance(leaf, Ref):
                value = self.env.get(leaf.id, _MISSING)
                if value is _MISSING:
                    missing = RemoteException("lookup", self.rank, f"no tensor {leaf.id}")
                    raise Failed(Poison(missing))
                if isinstance(value, Poison):
                    raise Failed(value)
                return value
            if isinstance(leaf, GroupRef):
                return self.group(leaf.dims, leaf.store).pg
            return leaf

        leaves, spec = flatten_call(args, kwargs)
        resolved: tuple[tuple[Any, ...], dict[str, Any]] = unflatten(
            [one(leaf) for leaf in leaves], spec
        )
        return resolved

    def function(self, func: object, load: bool = True) -> object:
        """A user's function as sent (``Pickled``), loaded once per worker (``load=False``:
        only if it was already, as an error message names it)."""
        if isinstance(func, Pickled):
            key = tuple(func.parts)
            if key not in self._functions:
                if not load:
                    return func
                self._functions[key] = loads(func.parts)
            return self._functions[key]
        return func

    def poison(self, out: Iterable[int], op: str, exc: BaseException) -> None:
        """Ids ``out`` hold ``exc`` as their fetch will raise it, naming ``op``."""
        tb = "".join(traceback.format_exception(exc))
        poison = Poison(RemoteException(op, self.rank, f"{type(exc).__name__}: {exc}", tb))
        for ref in out:
            self.env[ref] = poison

    def group(self, dims: tuple[int, ...], store: tuple[str, int]) -> Group:
        """This rank's gloo group along ``dims`` on the current stream (``_collective``)."""
        return self._groups.get(running.stream, dims, store, self._here())


class TensorInbox(Actor):
    """Receives the shards sent to this proc's workers from another mesh (``to_mesh``):
    an actor apart from the worker, whose thread may be waiting for them."""

    @endpoint
    def put(self, key: str, value: Any) -> None:
        deliver(key, value)


def op_name(command: Command) -> str:
    """A command as its span is named: its kind, and the function it calls if any."""
    func = getattr(command, "func", None)
    if isinstance(func, Shaped):
        func = func.func
    name = getattr(func, "name", None) or getattr(func, "__name__", None)
    return f"{type(command).__name__} {name}" if name else type(command).__name__


def lent(key: str) -> Any:
    """A monarch Tensor unpickled in an actor call: its shard on this proc, which the proc's
    worker hands over once it has run every command recorded before the call."""
    try:
        value = take(key, LENT_WAIT)
    except TimeoutError:
        raise RuntimeError(
            f"no shard of the monarch.Tensor reached this proc within {LENT_WAIT:.0f} s: an "
            "actor takes a monarch.Tensor only when it lives on the procs of the tensor's mesh"
        ) from None
    if isinstance(value, BaseException):
        raise value
    return value


class _Running(threading.local):
    """Whether this thread runs a worker's commands (where an ``OpaqueRef`` resolves), and
    of which stream."""

    def __init__(self) -> None:
        self.commands = False
        self.stream = 0


running = _Running()

_opaque_values: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
_opaque_keys = itertools.count(1)


class OpaqueRef:
    """An object that lives on the workers, passed between remote functions by reference
    (upstream's ``monarch.OpaqueRef``): a remote function makes one (``OpaqueRef(model)``)
    and returns it; the controller holds it (its key is a monarch Tensor, one per proc)
    and passes it to other remote functions, where ``ref.value`` is that proc's object.
    The object lives as long as the controller's ``OpaqueRef`` does.

    Its key is a 0-d int64 tensor: a pytree leaf, so the engine treats it as any tensor
    result (ids, poisoning, deletion); the object is held by the key tensor's identity.
    """

    _key: torch.Tensor

    def __init__(self, value: Any = None) -> None:
        self._key = torch.tensor(next(_opaque_keys), dtype=torch.int64)
        self._check("create")
        _opaque_values[self._key] = value

    @classmethod
    def _create(cls, key: torch.Tensor) -> OpaqueRef:
        made = cls.__new__(cls)
        made._key = key
        return made

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (OpaqueRef._create, (self._key,))

    def __repr__(self) -> str:
        return f"OpaqueRef({self._key!r})"

    @property
    def value(self) -> Any:
        self._check("access")
        return _opaque_values[self._key]

    @value.setter
    def value(self, value: Any) -> None:
        self._check("set")
        _opaque_values[self._key] = value

    def _check(self, what: str) -> None:
        """A worker's command, or the controller's run on meta tensors (shapes only)."""
        if not (running.commands or self._key.device.type == "meta"):
            raise RuntimeError(
                f"the controller tried to {what} an OpaqueRef's value: only a remote "
                "function (run by the workers) can"
            )


register_pytree_node(
    OpaqueRef,
    lambda ref: ([ref._key], None),
    lambda keys, _: OpaqueRef._create(next(iter(keys))),
)


def _portable(value: Any) -> Any:
    """A shard (or a remote function's result) as it should travel: tensors on the CPU (as
    upstream's fetch gives them: the controller may have no GPU), without autograd history,
    and without storage beyond their own."""
    if not isinstance(value, torch.Tensor):
        leaves, spec = flatten(value)
        if any(isinstance(leaf, torch.Tensor) for leaf in leaves):
            return unflatten([_portable(leaf) for leaf in leaves], spec)
        return value
    value = value.detach()
    if value.device.type != "cpu":
        return value.cpu()
    if value.untyped_storage().nbytes() != value.numel() * value.element_size():
        value = value.clone()
    return value


_MISSING = object()
