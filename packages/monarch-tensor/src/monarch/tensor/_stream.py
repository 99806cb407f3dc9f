"""Streams and borrows (upstream's ``Stream``, ``get_active_stream``, ``stream.borrow``).

A tensor belongs to the stream active when it was made, and an op may only use tensors of
the active stream: another stream's tensor is used through a borrow. Each stream of a
worker runs on a thread of its own (``_lanes``), so the work of two streams overlaps; a
borrow is where they meet: the borrowing stream waits for the lender's commands recorded
before the borrow, and after ``drop()`` the lender waits for the borrower's. The rules are
upstream's: a borrow reads the tensor's storage (and the lender may still read it, neither
may write) or, when ``mutable``, takes it (the lender may not touch it) until ``drop()``;
the borrowed tensor and its views are unusable after.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from ._commands import Command, Wait


class Recorder(Protocol):
    """What a borrow needs of its tensors' client (``_client.MeshClient``, which uses this
    module): record the lender's ``Wait``, free the borrowed ids."""

    def record(self, command: Command, stream: Stream | None = None) -> None: ...

    def free(self, ref: int) -> None: ...


class Tensor(Protocol):
    """What streams need of a monarch Tensor (``_tensor``, which uses this module)."""

    _aliases: StorageAliases
    _stream: Stream
    _ref: int

    @property
    def _client(self) -> Recorder: ...


class Stream:
    """A named stream of operations (``Stream("comms")``); ``activate()`` makes it the one
    new operations go to."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sid = next(_sids)
        """How commands name it to the workers (``main`` is 0)."""

    def __repr__(self) -> str:
        return f"<Stream({self.name!r}) at {hex(id(self))}>"

    def __str__(self) -> str:
        return f"stream {self.name!r}"

    @contextmanager
    def activate(self) -> Iterator[Stream]:
        previous = _active.stream
        _active.stream = self
        try:
            yield self
        finally:
            _active.stream = previous

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, Borrow]:
        """``t`` (a monarch Tensor) for use on this stream, until ``borrow.drop()``."""
        if not hasattr(t, "_borrowed_by"):
            raise TypeError(f"borrow takes a monarch.Tensor, not {type(t).__name__}")
        lender: StorageAliases = t._aliases
        if "r" not in lender.access:
            raise RuntimeError(
                "Cannot borrow this tensor: it (or a view) is lent mutably to another stream"
            )
        if mutable:
            if "w" not in lender.access:
                raise RuntimeError(
                    "Cannot borrow this tensor mutably because it (or a view) is already "
                    "being borrowed non-mutably."
                )
            lender.access = ""
            access = "rw"
        else:
            lender.access = access = "r"
        aliases = StorageAliases(access)
        borrow = Borrow(lender, aliases, t._client, t._stream, self)
        lender.live_borrows.add(borrow)
        return t._borrowed_by(self, aliases), borrow


class StorageAliases:
    """What the tensors sharing one storage (a tensor and its views) may do with it."""

    def __init__(self, access: str = "rw") -> None:
        self.access = access
        """"rw", "r" or "": read and write, read only, neither (lent mutably)."""
        self.tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()
        self.live_borrows: set[Borrow] = set()
        self.dropped = False


class Borrow:
    """A borrow of a tensor by another stream; ``drop()`` (or leaving ``with``) ends it."""

    def __init__(
        self,
        lender: StorageAliases,
        aliases: StorageAliases,
        client: Recorder,
        lending: Stream,
        borrowing: Stream,
    ) -> None:
        self._lender = lender
        self._aliases = aliases
        self._client = client
        self._lending = lending
        self._borrowing = borrowing

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()

    def drop(self) -> None:
        """The borrowed tensor (and its views) become unusable; the lender gets its rights
        back once its last borrow is dropped."""
        if self._aliases.dropped:
            return
        self._aliases.dropped = True
        if self._borrowing is not self._lending:
            # The lender's later commands wait for the borrower's so far (its reads, or
            # its writes of a mutable borrow), as upstream's stream synchronization does.
            self._client.record(Wait(self._borrowing.sid), self._lending)
        for tensor in list(self._aliases.tensors):
            tensor._client.free(tensor._ref)
        lender = self._lender
        lender.live_borrows.discard(self)
        if not lender.live_borrows:
            lender.access = "rw"


class _Active(threading.local):
    def __init__(self) -> None:
        self.stream = MAIN


_sids = itertools.count()
MAIN = Stream("main")
_active = _Active()


def get_active_stream() -> Stream:
    """The stream new operations go to (``main`` unless another is activated)."""
    return _active.stream


def check_inputs(func: object, tensors: Sequence[Tensor], mutated: Tensor | None) -> None:
    """Raise where upstream does: a tensor of another stream, a dropped borrow, a read of a
    storage lent mutably, a write to a storage lent (or borrowed) for reading. (A
    RuntimeError: torch turns a TypeError raised inside ``t + 1`` into NotImplemented, and
    the message would be lost.)"""
    stream = _active.stream
    for t in tensors:
        aliases = t._aliases
        if aliases.dropped:
            raise RuntimeError(f"{_name(func)}: a borrowed tensor used after its borrow.drop()")
        if t._stream is not stream:
            raise RuntimeError(
                f"{_name(func)}: WRONG_STREAM: a tensor of {t._stream} used on {stream}: "
                "borrow it for this stream first (`stream.borrow(t)`)"
            )
        if "r" not in aliases.access:
            raise RuntimeError(
                f"{_name(func)}: this tensor (or a view) is lent mutably to another stream: "
                "drop the borrow first"
            )
    if mutated is not None and "w" not in mutated._aliases.access:
        raise RuntimeError(
            f"{_name(func)}: writes a tensor whose storage is borrowed for reading (by or "
            "from another stream): drop the borrow first"
        )


def mutated_input(func: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The tensor an in-place op writes (its first argument, or ``out=``), else None."""
    out = kwargs.get("out")
    if out is not None:
        return out
    name = getattr(func, "__name__", "")
    in_place = (name.endswith("_") and not name.startswith("__")) or name in _IN_PLACE_DUNDERS
    return args[0] if in_place and args else None


_IN_PLACE_OPS = (
    "add",
    "sub",
    "mul",
    "matmul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "and",
    "or",
    "xor",
    "lshift",
    "rshift",
)
_IN_PLACE_DUNDERS = frozenset(f"__i{op}__" for op in _IN_PLACE_OPS) | {"__setitem__"}


def _name(func: object) -> str:
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", func))
