"""ValueMesh: the values gathered from a mesh, one per member, laid out like the mesh.

Two properties keep gathering cheap at scale. Values are run-length encoded over a table of
unique values, so a thousand identical replies (``None`` from every actor, the same config
dict) cost one stored value; identical means the same object for ``ValueMesh(shape, values)``
and the same pickled bytes for ``ValueMesh._from_pickled``. And replies can stay pickled: a
mesh built from payloads unpickles each unique payload the first time any rank holding it is
read (from this mesh or any mesh sliced from it), then caches the value.

Values are returned as they are. An exception object that a rank returned (or that the
gathering code chose to store for it) is a value like any other and is never raised here; the
caller decides what a failed rank means. If ``loads`` itself fails, the error propagates from
the access that triggered it and nothing is cached, so the next access tries again.
"""

from __future__ import annotations

import operator
import pickle
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Generic, SupportsIndex, TypeVar, cast, final

from monarch.core._layout._shape import MeshIndexError, MeshTrait, NDSlice, Point, Shape

__all__ = ["ValueMesh"]

R = TypeVar("R")

Payload = bytes | bytearray | memoryview


@final
class _Pickled:
    """A table entry still waiting to be unpickled."""

    __slots__ = ("payload",)

    def __init__(self, payload: Payload) -> None:
        self.payload = payload


@final
class _Table:
    """The unique values of a ValueMesh, shared with every mesh derived from it so each
    lazily held payload is unpickled once, whichever of them reads it first."""

    __slots__ = ("_entries", "_loads", "_lock")

    def __init__(self, entries: list[Any], loads: Callable[[Any], Any] | None = None) -> None:
        self._entries = entries
        self._loads = loads
        self._lock = threading.Lock()

    def get(self, slot: int) -> Any:
        entry = self._entries[slot]
        if type(entry) is not _Pickled:
            return entry
        with self._lock:  # another thread may be unpickling the same entry
            entry = self._entries[slot]
            if type(entry) is _Pickled:
                assert self._loads is not None
                value = self._loads(entry.payload)
                self._entries[slot] = value
                return value
            return entry


def _payload_key(payload: Payload) -> bytes | memoryview:
    """A dict key comparing payloads by content, without copying where hashing allows."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, memoryview):
        try:
            hash(payload)  # read-only byte views hash like the bytes they hold
            return payload
        except (TypeError, ValueError):
            pass
    return bytes(payload)


HTML_ROWS: Final = 64
"""Members a ValueMesh shows in a notebook; the rest are counted."""


class ValueMesh(MeshTrait, Generic[R]):
    """The result of ``call()``: one value per member of the mesh called, laid out the same way.

    ``items()`` (and iteration) yields ``(Point, value)`` in row-major order; ``item(**coords)``
    reads one value by coordinates; ``get(i)`` by row-major position. Slicing, flattening,
    splitting and renaming work as on any mesh. Not subscriptable (``vm[0]`` is a TypeError):
    use ``item`` or ``get``.
    """

    __slots__ = ("_run_slots", "_run_starts", "_shape", "_table")

    _shape: Shape
    _table: _Table
    _run_starts: list[int]  # row-major position where each run of one table slot begins
    _run_slots: list[int]  # table slot of each run

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        if len(values) != len(shape):
            raise ValueError(f"expected {len(shape)} values for shape {shape}, got {len(values)}")
        slot_of: dict[int, int] = {}
        entries: list[Any] = []
        slots: list[int] = []
        for value in values:  # ``values`` keeps every object alive, so ids are stable here
            slot = slot_of.get(id(value))
            if slot is None:
                slot = slot_of[id(value)] = len(entries)
                entries.append(value)
            slots.append(slot)
        self._init(shape, _Table(entries), slots)

    @staticmethod
    def from_indexed(shape: Shape, pairs: Sequence[tuple[int, R]]) -> ValueMesh[R]:
        """A mesh from ``(rank, value)`` pairs (ranks 0 .. len(shape) - 1 of ``shape``), the
        last pair of a rank winning; every rank must have one. Errors are upstream's."""
        given: tuple[object, object] = (shape, pairs)  # any objects may come
        if not isinstance(given[0], Shape):
            raise TypeError(f"argument 'shape': {_cannot_cast(shape, 'Shape')}")
        if isinstance(given[1], str):
            raise TypeError("argument 'pairs': Can't extract `str` to `Vec`")
        if not isinstance(given[1], Sequence):
            raise TypeError(f"argument 'pairs': {_cannot_cast(pairs, 'Sequence')}")
        checked: list[tuple[int, R]] = []
        for pair in given[1]:  # all of them first, as upstream converts its argument first
            if not isinstance(pair, tuple):
                raise TypeError(f"argument 'pairs': {_cannot_cast(pair, 'tuple')}")
            if len(pair) != 2:
                raise ValueError(f"expected tuple of length 2, but got tuple of length {len(pair)}")
            rank, value = pair
            if not isinstance(rank, SupportsIndex):
                kind = type(rank).__name__
                raise TypeError(
                    f"argument 'pairs': '{kind}' object cannot be interpreted as an integer"
                )
            index = operator.index(rank)
            if index < 0:
                raise OverflowError("can't convert negative int to unsigned")
            if index >= 2**64:
                raise OverflowError("int too big to convert")
            checked.append((index, value))
        n = len(shape)
        by_rank: dict[int, R] = {}
        for index, value in checked:
            if index >= n:
                raise ValueError(
                    f"invalid value mesh: expected {n} ranks, but contains {index + 1} ranks"
                )
            by_rank[index] = value
        if len(by_rank) != n:
            raise ValueError(
                f"invalid value mesh: expected {n} ranks, but contains {len(by_rank)} ranks"
            )
        return ValueMesh(shape, [by_rank[index] for index in range(n)])

    @classmethod
    def _from_pickled(
        cls,
        shape: Shape,
        payloads: Sequence[Payload],
        loads: Callable[[Any], Any] = pickle.loads,
    ) -> ValueMesh[Any]:
        """A mesh over pickled values, one payload per row-major position of ``shape``.

        Identical payloads are stored once; each is passed to ``loads`` on first access only.
        """
        if len(payloads) != len(shape):
            raise ValueError(
                f"expected {len(shape)} payloads for shape {shape}, got {len(payloads)}"
            )
        slot_of: dict[bytes | memoryview, int] = {}
        entries: list[Any] = []
        slots: list[int] = []
        for payload in payloads:
            key = _payload_key(payload)
            slot = slot_of.get(key)
            if slot is None:
                slot = slot_of[key] = len(entries)
                entries.append(_Pickled(payload))
            slots.append(slot)
        mesh: ValueMesh[Any] = cls.__new__(cls)
        mesh._init(shape, _Table(entries, loads), slots)
        return mesh

    def _init(self, shape: Shape, table: _Table, slots: Sequence[int]) -> None:
        self._shape = shape
        self._table = table
        starts: list[int] = []
        run_slots: list[int] = []
        previous = -1
        for position, slot in enumerate(slots):
            if slot != previous:
                starts.append(position)
                run_slots.append(slot)
                previous = slot
        self._run_starts = starts
        self._run_slots = run_slots

    def _slot(self, position: int) -> int:
        return self._run_slots[bisect_right(self._run_starts, position) - 1]

    # -- MeshTrait ---------------------------------------------------------------------------

    @property
    def _ndslice(self) -> NDSlice:
        return self._shape.ndslice

    @property
    def _labels(self) -> tuple[str, ...]:
        return tuple(self._shape.labels)

    @property
    def shape(self) -> Shape:
        return self._shape

    def _new_with_shape(self, shape: Shape) -> ValueMesh[R]:
        """The values of ``shape``'s global ranks, all of which this mesh must hold."""
        ndslice = self._shape.ndslice
        try:
            positions = [ndslice.index(rank) for rank in shape.ndslice]
        except ValueError:
            raise ValueError(f"shape {shape!r} is not a subset of {self._shape!r}") from None
        if len(self._run_slots) == 1:  # all values identical: the common case at scale
            slots: list[int] = [self._run_slots[0]] * len(positions)
        else:
            slots = [self._slot(position) for position in positions]
        mesh: ValueMesh[R] = ValueMesh.__new__(ValueMesh)
        mesh._init(shape, self._table, slots)  # share the table: lazy values load once
        return mesh

    # -- reading -----------------------------------------------------------------------------

    def get(self, rank: int) -> R:
        """The value at row-major position ``rank`` (0 .. len - 1) of this mesh."""
        n = len(self._shape)
        if not 0 <= rank < n:
            raise MeshIndexError(f"index {rank} out of range (len={n})")
        return cast(R, self._table.get(self._slot(rank)))

    def item(self, **kwargs: int) -> R:
        """The value at the given coordinates; every dimension must be named (KeyError
        otherwise), except that a single-member mesh needs none."""
        labels = self._shape.labels
        if not kwargs and len(self._shape) == 1:
            return self.get(0)
        extra = [key for key in kwargs if key not in labels]
        if extra:
            raise KeyError(f"item has extra dimensions: {extra}")
        missing = [label for label in labels if label not in kwargs]
        if missing:
            raise KeyError(f"item needs a coordinate for every dimension; missing {missing}")
        coords = [kwargs[label] for label in labels]
        ndslice = self._shape.ndslice
        return self.get(ndslice.index(ndslice.nditem(coords)))

    def values(self) -> list[R]:
        """All values in row-major order."""
        table = self._table
        ends = [*self._run_starts[1:], len(self._shape)]
        result: list[R] = []
        for start, end, slot in zip(self._run_starts, ends, self._run_slots, strict=True):
            result.extend([table.get(slot)] * (end - start))
        return result

    def items(self) -> list[tuple[Point, R]]:
        """``(Point, value)`` for every member in row-major order."""
        extent = self._shape.extent
        return [(Point(i, extent), value) for i, value in enumerate(self.values())]

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return iter(self.items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueMesh):
            return NotImplemented
        return self._shape == other._shape and self.values() == other.values()

    def __repr__(self) -> str:
        lines = [f"ValueMesh({self._shape.extent}):", "("]
        lines.extend(f"  ({point!r}, {value!r})," for point, value in self.items())
        lines.append(")")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """A table for notebooks: a column per dimension, then the value (the first
        ``HTML_ROWS`` members; the count of the rest below)."""
        import html  # for notebooks only: not imported by every process

        labels = list(self._shape.labels)
        extent = html.escape(str(self._shape.extent))
        head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
        rows = []
        for point, value in self.items()[:HTML_ROWS]:
            coords = "".join(f"<td>{point[label]}</td>" for label in labels)
            rows.append(f"<tr>{coords}<td><pre>{html.escape(repr(value))}</pre></td></tr>")
        more = len(self) - HTML_ROWS
        tail = f"<p>... {more} more</p>" if more > 0 else ""
        return (
            f"<p>ValueMesh {extent}</p><table><tr>{head}<th>value</th></tr>"
            f"{''.join(rows)}</table>{tail}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickle everything here: ``loads`` may depend on this process (out-of-band
        # buffers, mailboxes); the receiver gets plain values, still stored once each.
        used: dict[int, int] = {}
        for slot in self._run_slots:
            used.setdefault(slot, len(used))
        entries = [self._table.get(slot) for slot in used]
        return (
            _restore_value_mesh,
            (self._shape, entries, self._run_starts, [used[s] for s in self._run_slots]),
        )


def _cannot_cast(value: object, to: str) -> str:
    return f"'{type(value).__name__}' object cannot be cast as '{to}'"


def _restore_value_mesh(
    shape: Shape, entries: list[Any], run_starts: list[int], run_slots: list[int]
) -> ValueMesh[Any]:
    mesh: ValueMesh[Any] = ValueMesh.__new__(ValueMesh)
    mesh._shape = shape
    mesh._table = _Table(entries)
    mesh._run_starts = list(run_starts)
    mesh._run_slots = list(run_slots)
    return mesh
