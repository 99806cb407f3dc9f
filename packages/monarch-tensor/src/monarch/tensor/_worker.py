"""The worker: one actor per proc holding one local shard per tensor id.

It runs each stream's commands in the order they were recorded (the streams at once, each
on its thread, ordered between them where they share a tensor: see ``_lanes``, ``run``
and ``_needs``). A failing command never
raises out of the endpoint (a broadcast's failure has nobody to tell): its outputs become
``_Poison``, and every later command reading a poisoned id poisons its own outputs, so
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
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import register_pytree_node
from torch.utils.weak import WeakTensorKeyDictionary

from monarch.core import Actor, Point, advise_huge_pages, context, endpoint, loads

from ._commands import (
    CALL,
    DELETE,
    LEND,
    OP,
    RECV,
    REDUCE,
    SEND,
    STREAM,
    WAIT,
    GroupRef,
    Pickled,
    Ref,
    Shaped,
    op_name,
)
from ._errors import RemoteException
from ._flat import flatten, flatten_call, unflatten
from ._host import reachable_host
from ._inbox import deliver, take
from ._lanes import Lane, settled

LENT_WAIT = 120.0
"""Seconds an actor call waits for the shard it was given (its worker may be busy)."""

COLLECTIVE_TIMEOUT = timedelta(seconds=120)
"""A peer that never joins a collective fails it (then its outputs are poisoned)."""


class _Poison:
    """What a failed id holds: the exception its fetch raises."""

    __slots__ = ("error",)

    def __init__(self, error: RemoteException) -> None:
        self.error = error


class _Failed(Exception):
    """An input of a command is poisoned: its outputs get the same poison."""

    def __init__(self, poison: _Poison) -> None:
        self.poison = poison


class TensorWorker(Actor):
    """The tensor engine of one proc (spawned by the controller on first use of a mesh)."""

    def __init__(self) -> None:
        self._env: dict[int, Any] = {}
        self._point: Point | None = None
        self._groups: dict[tuple[int, ...], tuple[Any, int, int]] = {}
        """Per stream and set of mesh dimensions: each stream has its own groups (two
        streams' collectives, issued in different orders by different ranks, must not
        meet in one group)."""
        self._store: Any = None
        self._functions: dict[tuple[bytes, ...], Any] = {}
        self._batches = 0
        self._changed = threading.Condition()
        self._lanes: dict[int, Lane] = {}
        self._current = 0
        """The stream the commands of the next batch are for (a ``STREAM`` command says)."""
        self._streams = False
        """Whether a stream other than ``main`` has had commands (then each is routed)."""
        self._writer: dict[int, int] = {}
        """The stream that last wrote each id, where it is not ``main``."""
        self._readers: dict[int, set[int]] = {}
        """The other streams that read each id since it was written."""
        self._group_lock = threading.Lock()

    @property
    def _rank(self) -> int:
        return self._here().rank

    def _here(self) -> Point:
        """This worker's point in its mesh, as the first ``run`` (sent to all) tells it."""
        if self._point is None:
            self._point = context().message_rank
        return self._point

    @endpoint
    def run(self, commands: list[tuple[Any, ...]]) -> None:
        """Queue a batch of commands on their streams (fire and forget: failures poison,
        never raise). Until a second stream appears, the batch runs here, on the actor's
        thread, as it comes (no thread to hand it to, nothing to overlap with)."""
        self._here()
        self._batches += 1
        if not self._streams and not any(command[0] == STREAM for command in commands):
            self._execute(0, commands)
            return
        self._streams = True
        lane = self._current
        segment: list[tuple[Any, ...]] = []
        needs: list[tuple[Lane, int]] = []

        def push() -> None:
            if segment or needs:
                self._lane(lane).push(segment, needs)

        for command in commands:
            tag = command[0]
            if tag in (STREAM, WAIT, DELETE):
                push()
                segment, needs = [], []
                if tag == STREAM:
                    lane = command[1]
                elif tag == WAIT:
                    self._lane(lane).push([], self._now({command[1]}))
                else:
                    self._delete(command[1])
                continue
            waits = self._needs(lane, command)
            if waits:
                push()
                segment, needs = [], waits
            segment.append(command)
        push()
        self._current = lane

    def _execute(self, sid: int, commands: list[tuple[Any, ...]]) -> None:
        """Run a segment of stream ``sid``'s commands (on that stream's thread)."""
        running.commands = True
        running.stream = sid
        for command in commands:
            tag = command[0]
            try:
                if tag == OP:
                    self._op(*command[1:])
                elif tag == DELETE:
                    for ref in command[1]:
                        self._env.pop(ref, None)
                elif tag == REDUCE:
                    self._reduce(*command[1:])
                elif tag == SEND:
                    self._send(*command[1:])
                elif tag == RECV:
                    self._recv(*command[1:])
                elif tag == LEND:
                    self._lend(*command[1:])
                elif tag == CALL:
                    self._call(*command[1:])
            except Exception as exc:  # noqa: BLE001 - a bug here must not fail the actor
                self._poison(_outputs(command), f"command {tag}", exc)

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

    def _needs(self, sid: int, command: tuple[Any, ...]) -> list[tuple[Lane, int]]:
        """What ``command``, on stream ``sid``, waits for: the stream that last wrote a
        tensor it reads or writes, and the streams that read one it writes since. (Within
        the rules, only a borrow reads another stream's tensor; actor calls, ``to_mesh``
        and adverbs may, and are ordered alike.)"""
        reads, writes = _touches(command)
        others: set[int] = set()
        for ref in reads:
            writer = self._writer.get(ref, 0)
            if writer != sid:
                others.add(writer)
                self._readers.setdefault(ref, set()).add(sid)
        for ref in writes:
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
            self._lane(writer).push([(DELETE, tuple(gone))], self._now(waits))

    def _settled(self, refs: Iterable[int] | None = None) -> None:
        """Wait until the commands queued so far that write ``refs`` (default: all) ran."""
        sids = self._lanes if refs is None else {self._writer.get(ref, 0) for ref in refs}
        settled(self._changed, self._now(sids))

    @endpoint
    def fetch(self, ids: list[int], rank: int) -> Any:
        """The values of ``ids`` here (the controller calls ``rank``'s worker alone), or the
        exception that one of them holds, returned (not raised) so the controller can raise
        it as is. (Not ``_here()``: a sliced call's point is the slice's.)"""
        self._settled(ids)
        values = []
        for ref in ids:
            value = self._env.get(ref, _MISSING)
            if value is _MISSING:
                return RemoteException("fetch", rank, f"no tensor with id {ref} on this worker")
            if isinstance(value, _Poison):
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
        return sorted(self._env)

    def _resolve(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """The arguments with each ``Ref`` replaced by this worker's shard."""

        def one(leaf: Any) -> Any:
            if isinstance(leaf, Ref):
                value = self._env.get(leaf.id, _MISSING)
                if value is _MISSING:
                    missing = RemoteException("lookup", self._rank, f"no tensor {leaf.id}")
                    raise _Failed(_Poison(missing))
                if isinstance(value, _Poison):
                    raise _Failed(value)
                return value
            if isinstance(leaf, GroupRef):
                return self._group(leaf.dims, leaf.store)[0]
            return leaf

        leaves, spec = flatten_call(args, kwargs)
        resolved: tuple[Any, Any] = unflatten([one(leaf) for leaf in leaves], spec)
        return resolved

    def _op(self, out: tuple[int, ...], func: Any, args: Any, kwargs: Any, grad: bool) -> None:
        try:
            shapes = None
            if isinstance(func, Shaped):
                func, shapes = func.func, func.shapes
            result = self._apply(func, args, kwargs, grad)
            tensors = [x for x in flatten(result)[0] if isinstance(x, torch.Tensor)]
            if len(tensors) != len(out):
                raise TypeError(
                    f"returned {len(tensors)} tensors where the controller expected {len(out)}"
                )
            if shapes is not None:
                _check_shapes(tensors, shapes)
        except _Failed as failed:
            for ref in out:
                self._env[ref] = failed.poison
            return
        except Exception as exc:  # noqa: BLE001 - poisons the outputs, raised at their fetch
            self._poison(out, op_name(self._function(func, load=False)), exc)
            return
        for ref, tensor in zip(out, tensors, strict=True):
            self._env[ref] = tensor

    def _call(self, out: int, func: Any, args: Any, kwargs: Any, grad: bool) -> None:
        """A remote function's adverb call: its result, whatever it is, held at ``out``."""
        try:
            self._env[out] = self._apply(func, args, kwargs, grad)
        except _Failed as failed:
            self._env[out] = failed.poison
        except Exception as exc:  # noqa: BLE001 - poisons the result, raised at its fetch
            self._poison((out,), op_name(self._function(func, load=False)), exc)

    def _apply(self, func: Any, args: Any, kwargs: Any, grad: bool) -> Any:
        func = self._function(func)
        args, kwargs = self._resolve(args, kwargs)
        with torch.set_grad_enabled(grad):
            return func(*args, **kwargs)

    def _function(self, func: Any, load: bool = True) -> Any:
        """A user's function as sent (``Pickled``), loaded once per worker."""
        if isinstance(func, Pickled):
            key = tuple(func.parts)
            if key not in self._functions:
                if not load:
                    return func
                self._functions[key] = loads(func.parts)
            return self._functions[key]
        return func

    def _poison(self, out: tuple[int, ...], op: str, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(exc))
        poison = _Poison(RemoteException(op, self._rank, f"{type(exc).__name__}: {exc}", tb))
        for ref in out:
            self._env[ref] = poison

    # -- to_mesh ---------------------------------------------------------------------------

    def _send(
        self, source: int, key: str, plan: dict[int, list[dict[str, int]]], inbox: Any
    ) -> None:
        """Send this rank's shard of ``source`` (or the error it holds: the receivers are
        poisoned alike) to the inbox of each destination ``plan`` names for it."""
        targets = plan.get(self._rank)
        if not targets:
            return
        value = self._env.get(source, _MISSING)
        if value is _MISSING:
            payload: Any = RemoteException("to_mesh", self._rank, f"no tensor {source}")
        elif isinstance(value, _Poison):
            payload = value.error
        else:
            payload = value.detach()
        for coords in targets:
            inbox.slice(**coords).put.broadcast(key, payload)

    def _recv(self, out: int, key: str) -> None:
        """Wait for the shard that a ``_send`` of another mesh (or this one) sends here."""
        try:
            value = take(key, COLLECTIVE_TIMEOUT.total_seconds())
        except TimeoutError as exc:
            self._poison((out,), "to_mesh", exc)
            return
        if isinstance(value, RemoteException):
            self._env[out] = _Poison(value)
        else:
            self._env[out] = value.contiguous()

    def _lend(self, source: int, key: str) -> None:
        """Hand the shard itself (or the error it holds) to this proc's actor whose call
        arguments name it (see ``_lent``)."""
        value = self._env.get(source, _MISSING)
        if value is _MISSING:
            value = RemoteException("actor call", self._rank, f"no tensor {source}")
        elif isinstance(value, _Poison):
            value = value.error
        deliver(key, value)

    # -- collectives ---------------------------------------------------------------------

    def _group(self, dims: tuple[int, ...], store: tuple[str, int]) -> tuple[Any, int, int]:
        """This rank's gloo group along ``dims`` (the ranks that differ from it only there),
        with its rank in the group and the group's size. The groups are this worker's own,
        not torch.distributed's global one: meshes and their slices may share a process."""
        sid = running.stream
        key = (sid, *dims)
        if key not in self._groups:
            here = self._here()
            sizes = here.extent.sizes
            with self._group_lock:  # not around the group: that waits for the peers
                if self._store is None:
                    host, port = store
                    self._store = dist.TCPStore(  # type: ignore[attr-defined]
                        host,
                        port,
                        here.extent.nelements,
                        is_master=False,
                        timeout=COLLECTIVE_TIMEOUT,
                    )
            coords = [here[label] for label in here.extent.labels]
            ranks = []
            for varied in itertools.product(*(range(sizes[d]) for d in dims)):
                point = list(coords)
                for d, c in zip(dims, varied, strict=True):
                    point[d] = c
                ranks.append(_linear(point, sizes))
            ranks.sort()
            kept = ",".join(str(c) for d, c in enumerate(coords) if d not in dims)
            prefix = f"reduce/{sid}/{','.join(map(str, dims))}/{kept}"
            group = dist.ProcessGroupGloo(
                dist.PrefixStore(prefix, self._store),  # type: ignore[attr-defined]
                ranks.index(here.rank),
                len(ranks),
                _gloo_options(),
            )
            self._groups[key] = (group, ranks.index(here.rank), len(ranks))
        return self._groups[key]

    def _reduce(
        self,
        out: int,
        source: int,
        dims: tuple[int, ...],
        reduction: str,
        scatter: bool,
        store: tuple[str, int],
        shape: tuple[int, ...],
        dtype: torch.dtype,
    ) -> None:
        op = f"reduce({reduction})"
        try:
            group, index, size = self._group(dims, store)
            value = self._env.get(source, _MISSING)
            failed = value is _MISSING or isinstance(value, _Poison)
            # Every rank takes part even with a failed input, or its peers would wait forever.
            flag = torch.tensor([1 if failed else 0])
            _all_reduce(group, flag, dist.ReduceOp.MAX)
            if failed or flag.item():
                own = value.error if isinstance(value, _Poison) else None
                self._env[out] = _Poison(
                    own or RemoteException(op, self._rank, "an input of the reduction failed")
                )
                return
            inplace = out == source
            self._env[out] = _collective(value, group, index, size, reduction, scatter, inplace)
        except Exception as exc:  # noqa: BLE001 - poisons the output, raised at its fetch
            self._poison((out,), op, exc)


class TensorInbox(Actor):
    """Receives the shards sent to this proc's workers from another mesh (``to_mesh``):
    an actor apart from the worker, whose thread may be waiting for them."""

    @endpoint
    def put(self, key: str, value: Any) -> None:
        deliver(key, value)


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

    _key: Any

    def __init__(self, value: Any = None) -> None:
        self._key = torch.tensor(next(_opaque_keys), dtype=torch.int64)
        self._check("create")
        _opaque_values[self._key] = value

    @classmethod
    def _create(cls, key: Any) -> OpaqueRef:
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


def _all_reduce(group: Any, tensor: torch.Tensor, op: Any) -> None:
    options = dist.AllreduceOptions()
    options.reduceOp = op
    group.allreduce([tensor], options).wait()


def _collective(
    value: torch.Tensor,
    group: Any,
    index: int,
    size: int,
    reduction: str,
    scatter: bool,
    inplace: bool,
) -> Any:
    if reduction == "stack":
        parts = [torch.empty_like(value) for _ in range(size)]
        group.allgather([parts], [value.detach().contiguous()]).wait()
        return torch.stack(parts)
    target = value if inplace else _fresh_copy(value.detach())
    ops = {
        "sum": dist.ReduceOp.SUM,
        "avg": dist.ReduceOp.SUM,
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
    }
    with torch.no_grad():
        if not target.is_contiguous():  # gloo reduces contiguous memory: reduce a copy
            dense = target.contiguous()
            _all_reduce(group, dense, ops[reduction])
            target.copy_(dense)
        else:
            _all_reduce(group, target, ops[reduction])
        if reduction == "avg":
            if inplace:
                target.div_(size)
            else:
                target = target / size
    if scatter:
        return target.chunk(size)[index].clone()
    return target


def _fresh_copy(value: torch.Tensor) -> torch.Tensor:
    """``value.clone()`` into memory advised to use huge pages before it is first touched:
    a large fresh tensor otherwise costs more in page faults than the copy (a reduction's
    output: 3x faster at 128 MiB here)."""
    out = torch.empty_like(value, memory_format=torch.preserve_format)
    advise_huge_pages(out.data_ptr(), out.untyped_storage().nbytes())
    return out.copy_(value)


def _outputs(command: tuple[Any, ...]) -> tuple[int, ...]:
    """The ids a command writes (what a failure of it poisons)."""
    if command[0] == OP:
        return tuple(command[1])
    if command[0] in (REDUCE, RECV, CALL):
        return (command[1],)
    return ()


def _check_shapes(tensors: list[torch.Tensor], shapes: list[tuple[tuple[int, ...], str]]) -> None:
    """A ``"cached"`` propagation's results must have, on every proc, the first proc's
    shapes and dtypes (the controller's tensors have them): else the op fails here."""
    for i, (tensor, (shape, dtype)) in enumerate(zip(tensors, shapes, strict=True)):
        mine = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        if mine != (shape, dtype):
            raise ValueError(
                f"result {i} is {mine[1]}{list(mine[0])} here but {dtype}{list(shape)} on the "
                "first proc, whose run said the shapes (propagate='cached'): every proc's "
                "results must have the first proc's shapes; give propagate= a function instead"
            )


def _touches(command: tuple[Any, ...]) -> tuple[list[int], tuple[int, ...]]:
    """The ids a command reads and those it writes."""
    tag = command[0]
    if tag == OP:
        return _refs(command[3], command[4]), command[1]
    if tag == CALL:
        return _refs(command[3], command[4]), (command[1],)
    if tag == REDUCE:
        return [command[2]], (command[1],)
    if tag in (SEND, LEND):
        return [command[1]], ()
    if tag == RECV:
        return [], (command[1],)
    return [], ()


def _refs(args: Any, kwargs: Any) -> list[int]:
    return [leaf.id for leaf in flatten_call(args, kwargs)[0] if isinstance(leaf, Ref)]


def _linear(coords: list[int], sizes: list[int]) -> int:
    rank = 0
    for c, s in zip(coords, sizes, strict=True):
        rank = rank * s + c
    return rank


def _portable(value: Any) -> Any:
    """A shard (or a remote function's result) as it should travel: tensors without autograd
    history, and without storage beyond their own."""
    if not isinstance(value, torch.Tensor):
        leaves, spec = flatten(value)
        if any(isinstance(leaf, torch.Tensor) for leaf in leaves):
            return unflatten([_portable(leaf) for leaf in leaves], spec)
        return value
    value = value.detach()
    if value.untyped_storage().nbytes() != value.numel() * value.element_size():
        value = value.clone()
    return value


def _gloo_options() -> Any:
    """gloo on this proc's network address: by default gloo listens where the machine's
    name resolves, which peers on other machines may not reach (loopback; no address at all
    in a container or a network namespace): their collectives would wait out the timeout."""
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = COLLECTIVE_TIMEOUT
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=reachable_host())]
    return options


_MISSING = object()
