"""Pickling of user values: cloudpickle, protocol 5, out-of-band buffers as separate parts.

Values travel as ``[pickle, buffer, buffer, ...]`` so a tensor's (``_tensors``) or a
bytearray's memory is a frame part of its own, written from where it lies and never joined into the
pickle. cloudpickle sends classes and functions of ``__main__`` by value, which is what
lets a user's script define actors that its worker processes can run; values made only
of builtins take the C pickler, which is several times faster.

The pickle is written into upstream's ``Buffer`` (``_buffers``): a ``bytes`` of 64 KiB or
more anywhere in the value (an attribute of a user's object, where protocol 5 cannot take it
out of band) is handed to it whole by the pickler and kept, not copied, so the message
carries it as a part of its own; such a pickle travels as
``[header, stream part, ..., buffer, ...]``, the header a small pickle that reads the rest.
"""

from __future__ import annotations

import pickle
import types
from collections import ChainMap
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, ClassVar, Final

import cloudpickle

from monarch.transport import Buffer

from ._buffers import Buffer as WriteBuffer
from ._memory import copy_into, copy_to_bytes, fresh_bytearray
from ._tensors import reduce_tensor, tensor_type

OUT_OF_BAND_MIN: Final = 4096
"""Buffers smaller than this are cheaper inside the pickle than as a part of their own."""

_PLAIN: Final = frozenset({int, float, bool, str, type(None), complex})
_PLAIN_BUFFERS: Final = frozenset({bytes, bytearray})


class _OutOfBand:
    """Stands in for a large bytes/bytearray, which pickle would copy into the stream
    (the C pickler handles those types before any override can see them)."""

    __slots__ = ("value",)

    def __init__(self, value: bytes | bytearray) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        if type(self.value) is bytes:
            return _rebuild_bytes, (pickle.PickleBuffer(self.value),)
        return bytearray, (pickle.PickleBuffer(self.value),)


def _rebuild_bytes(buffer: Any) -> bytes:
    """The ``bytes`` a buffer holds: the very object when the buffer is (a whole view of)
    a ``bytes`` (one read from another process straight into it, or one sent within
    this process), else a copy."""
    if type(buffer) is bytes:
        return buffer
    view = memoryview(buffer)
    whole = view.obj
    if type(whole) is bytes and view.nbytes == len(whole):
        return whole
    return copy_to_bytes(view)


def _lift_buffers(obj: Any, depth: int = 0) -> Any:
    """``obj`` with large bytes/bytearrays (in nested tuples, lists, dicts) marked to
    travel out of band; returns ``obj`` itself when it holds none."""
    kind = type(obj)
    if kind in _PLAIN_BUFFERS:
        return _OutOfBand(obj) if len(obj) >= OUT_OF_BAND_MIN else obj
    if depth >= 3:
        return obj
    if kind is tuple or kind is list:
        items = [_lift_buffers(x, depth + 1) for x in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        return kind(items)
    if kind is dict:
        values = {k: _lift_buffers(v, depth + 1) for k, v in obj.items()}
        if all(values[k] is v for k, v in obj.items()):
            return obj
        return values
    return obj


def _is_plain(obj: Any, depth: int = 0) -> bool:
    """Builtins only, small enough to check quickly: safe for the C pickler as is."""
    kind = type(obj)
    if kind in _PLAIN:
        return True
    if kind in _PLAIN_BUFFERS:
        return len(obj) < OUT_OF_BAND_MIN
    if depth >= 3:
        return False
    if kind is tuple or kind is list:
        return len(obj) <= 16 and all(_is_plain(x, depth + 1) for x in obj)
    if kind is dict:
        return len(obj) <= 16 and all(
            type(k) is str and _is_plain(v, depth + 1) for k, v in obj.items()
        )
    return False


_CLOUDPICKLE_CODE: Final = cloudpickle.Pickler.dispatch_table[types.CodeType]
_DYNAMIC: Final = "<dynamic-code>"
"""The file name cloudpickle gives the code it sends by value."""


def _code_with_its_file(code: types.CodeType) -> Any:
    """cloudpickle's reduction of code sent by value, keeping the file it came from
    (cloudpickle writes ``<dynamic-code>``): a proc's tracebacks and pdb then name the
    client's script or notebook cell, whose lines the debugger asks of the root."""
    constructor, args = _CLOUDPICKLE_CODE(code)
    return constructor, tuple(code.co_filename if arg == _DYNAMIC else arg for arg in args)


class _CodePickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle is untyped
    """cloudpickle, with code sent by value keeping its file name."""

    dispatch_table: ClassVar[ChainMap[type, Any]] = ChainMap(
        {types.CodeType: _code_with_its_file}, cloudpickle.Pickler.dispatch_table
    )


class _Pickler(_CodePickler):
    """cloudpickle, with torch tensors reduced to one buffer each (see ``_tensors``)."""

    def __init__(self, file: WriteBuffer, tensor: type, buffer_callback: Any) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffer_callback)
        self._tensor = tensor
        self.copies: set[int] = set()
        """The buffers of the tensors' copies (by id, alive while pickling): snapshots
        already, not copied again (see ``dumps``)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is self._tensor:
            reduced = reduce_tensor(obj)
            if reduced is not None:
                self.copies.add(id(reduced[1][0].raw().obj))
                return reduced
        return super().reducer_override(obj)


_NO_ARGUMENTS: Final = pickle.dumps(((), {}), protocol=5)


_calling: ContextVar[tuple[str, Any] | None] = ContextVar("monarch_calling_endpoint", default=None)


def calling_endpoint() -> str | None:
    """The endpoint whose call arguments this thread is pickling, else None: an object of
    a sibling wheel may pickle as a reference only there (a monarch-tensor Tensor travels
    to an actor as its proc's shard, and is refused anywhere else)."""
    calling = _calling.get()
    return None if calling is None else calling[0]


def calling_target() -> Any:
    """The actor mesh (or slice) whose endpoint is being called meanwhile, else None."""
    calling = _calling.get()
    return None if calling is None else calling[1]


def dumps_call_arguments(
    endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any = None
) -> list[Buffer]:
    """``dumps_arguments`` of a call to ``endpoint`` of ``target`` (``calling_endpoint()``
    and ``calling_target()`` say them meanwhile)."""
    if not args and not kwargs:
        return [_NO_ARGUMENTS]
    token = _calling.set((endpoint, target))
    try:
        return dumps((args, kwargs))
    finally:
        _calling.reset(token)


def dumps_spawn(
    cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], extra: object = None
) -> list[Buffer]:
    """``dumps((cls, args, kwargs, extra))`` of a spawn: its arguments are a call of
    ``__init__`` (``calling_endpoint()`` says so meanwhile), so a distributed tensor among
    them reaches each actor as its proc's shard, as in an endpoint call."""
    token = _calling.set(("__init__", None))
    try:
        return dumps((cls, args, kwargs, extra))
    finally:
        _calling.reset(token)


def dumps_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Buffer]:
    """``dumps((args, kwargs))``, the arguments of a call: none at all is common enough to
    keep its pickle at hand."""
    if not args and not kwargs:
        return [_NO_ARGUMENTS]
    return dumps((args, kwargs))


def size_of(parts: Sequence[Buffer]) -> int:
    """The bytes of a pickle and its buffers (what ``codec_max_frame_length`` bounds)."""
    return sum(len(part) if type(part) is bytes else memoryview(part).nbytes for part in parts)


def dumps(obj: object) -> list[Buffer]:
    """Pickle ``obj``; the first part is the pickle, the rest its out-of-band buffers.

    A value is taken as it is at the call, as upstream's pickle takes it: an out-of-band
    buffer its owner may still change (a bytearray, an array's memory) is copied here,
    since the message may be written, or lent to its reader, after the caller has gone
    on and changed it. Read-only ones (bytes) and a tensor's copy (see ``_tensors``) are not.
    """
    if _is_plain(obj):
        return [pickle.dumps(obj, protocol=5)]
    buffers: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True  # serialize in band
        if not raw.readonly and id(raw.obj) not in copies:
            snapshot = fresh_bytearray(raw.nbytes)
            copy_into(snapshot, raw)
            raw = memoryview(snapshot)
        buffers.append(raw)
        return False

    lifted = _lift_buffers(obj)
    tensor = tensor_type()
    copies: set[int] = set()
    sink = WriteBuffer()
    if tensor is None:
        _CodePickler(sink, protocol=5, buffer_callback=keep).dump(lifted)
    else:
        pickler = _Pickler(sink, tensor, buffer_callback=keep)
        copies = pickler.copies
        pickler.dump(lifted)
    stream = sink.parts()
    if len(stream) == 1:
        data = stream[0] if type(stream[0]) is bytes else bytes(stream[0])
        return [data, *buffers]
    return [_stream_header(len(stream), [*stream, *buffers]), *stream, *buffers]


def _stream_header(streamed: int, parts: list[Any]) -> bytes:
    """The first part of a pickle written in several parts (its pickler handed a large
    ``bytes`` to the ``WriteBuffer`` whole, which kept it): a small pickle of a call to
    ``_load_stream`` whose arguments are the parts after it, out of band, so that ``loads``
    stays one ``pickle.loads`` whichever way a value was written."""
    return pickle.dumps(_Streamed(streamed, parts), protocol=5, buffer_callback=_out_of_band)


def _out_of_band(buffer: pickle.PickleBuffer) -> bool:
    return False


class _Streamed:
    """Stands in for a pickle stream's parts and its out-of-band buffers."""

    __slots__ = ("parts", "streamed")

    def __init__(self, streamed: int, parts: list[Any]) -> None:
        self.streamed = streamed
        self.parts = parts

    def __reduce__(self) -> tuple[Any, ...]:
        return _load_stream, (self.streamed, *map(pickle.PickleBuffer, self.parts))


def _load_stream(streamed: int, *parts: Any) -> Any:
    """Unpickle the stream of ``parts[:streamed]`` with the buffers after them."""
    reader: Any = _PartsReader(parts[:streamed])  # read() returns views: the C unpickler's
    return pickle.Unpickler(reader, buffers=parts[streamed:]).load()  # typeshed says bytes


class _PartsReader:
    """A pickle stream in parts, read as one file: a read within a part is a view of it;
    the unpickler reads a large ``bytes`` into its new object (``readinto``), one copy."""

    __slots__ = ("_at", "_parts")

    def __init__(self, parts: Sequence[Any]) -> None:
        self._parts = [memoryview(part).cast("B") for part in parts]
        self._parts.reverse()  # the next part last: popped when done
        self._at = 0

    def read(self, size: int = -1) -> memoryview | bytes:
        if size < 0:
            if not self._parts:
                return b""
            rest = b"".join([self._parts[-1][self._at :], *reversed(self._parts[:-1])])
            self._parts, self._at = [], 0
            return rest
        if self._parts and self._at + size <= len(self._parts[-1]):
            part, start = self._parts[-1], self._at
            self._step(part, start + size)
            return part[start : start + size]
        out = bytearray(size)
        return bytes(out[: self.readinto(out)])

    def _step(self, part: memoryview, to: int) -> None:
        """Read ``part`` (the next) up to ``to``; past it when that is its end."""
        if to == len(part):
            self._parts.pop()
            to = 0
        self._at = to

    def readinto(self, target: Any) -> int:
        view = memoryview(target).cast("B")
        done = 0
        while done < len(view) and self._parts:
            part = self._parts[-1]
            take = min(len(view) - done, len(part) - self._at)
            view[done : done + take] = part[self._at : self._at + take]
            done += take
            self._step(part, self._at + take)
        return done

    def readline(self) -> bytes:
        line = bytearray()
        while self._parts and not line.endswith(b"\n"):
            part = self._parts[-1]
            rest = part[self._at :]
            newline = bytes(rest).find(b"\n")
            take = len(rest) if newline < 0 else newline + 1
            line += rest[:take]
            self._step(part, self._at + take)
        return bytes(line)


def loads(parts: Sequence[Buffer]) -> Any:
    """Inverse of :func:`dumps`."""
    return pickle.loads(parts[0], buffers=parts[1:])


def loads_arguments(parts: Sequence[Buffer]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inverse of :func:`dumps_arguments`."""
    if len(parts) == 1 and parts[0] == _NO_ARGUMENTS:
        return (), {}
    args: tuple[tuple[Any, ...], dict[str, Any]] = pickle.loads(parts[0], buffers=parts[1:])
    return args
