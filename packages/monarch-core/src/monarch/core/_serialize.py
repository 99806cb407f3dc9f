"""Pickling of user values: cloudpickle, protocol 5, out-of-band buffers as separate parts.

Values travel as ``[pickle, buffer, buffer, ...]`` so a tensor's (``_tensors``) or a
bytearray's memory is a frame part of its own, written from where it lies and never joined into the
pickle. cloudpickle sends classes and functions of ``__main__`` by value, which is what
lets a user's script define actors that its worker processes can run; values made only
of builtins take the C pickler, which is several times faster.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, Final

import cloudpickle

from monarch.transport import Buffer

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


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle is untyped
    """cloudpickle, with torch tensors reduced to one buffer each (see ``_tensors``)."""

    def __init__(self, file: io.BytesIO, tensor: type, buffer_callback: Any) -> None:
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
    if tensor is None:
        data = cloudpickle.dumps(lifted, protocol=5, buffer_callback=keep)
    else:
        out = io.BytesIO()
        pickler = _Pickler(out, tensor, buffer_callback=keep)
        copies = pickler.copies
        pickler.dump(lifted)
        data = out.getvalue()
    if not buffers:
        return [data]
    return [data, *buffers]


def loads(parts: Sequence[Buffer]) -> Any:
    """Inverse of :func:`dumps`."""
    return pickle.loads(parts[0], buffers=parts[1:])


def loads_arguments(parts: Sequence[Buffer]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inverse of :func:`dumps_arguments`."""
    if len(parts) == 1 and parts[0] == _NO_ARGUMENTS:
        return (), {}
    args: tuple[tuple[Any, ...], dict[str, Any]] = pickle.loads(parts[0], buffers=parts[1:])
    return args
