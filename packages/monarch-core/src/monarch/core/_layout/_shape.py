"""The slicing algebra of meshes: strided rank regions, labelled shapes, points and extents.

Every mesh (hosts, procs, actors, gathered values) is a labelled, row-major, strided view of a
set of global ranks. Slicing, splitting, flattening and renaming never move data: they only
rewrite ``(labels, offset, sizes, strides)``, which is why they live here, in pure Python with
no runtime dependencies, and why ``MeshTrait`` can give all of them to any class that can say
what its shape is and build a copy of itself with another one.

Reprs and error types follow upstream ``torchmonarch`` 0.7.0 (``Slice { ... }``, ``{gpus: 2}``,
``{'gpus': 0/2}``). Where upstream raises different exception types for the same mistake, the
errors here inherit from all of them (``DimensionError``, ``MeshIndexError``), so code written
against either behaviour keeps working.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Self, SupportsIndex, final, overload

from monarch.core._errors import DimensionError, MeshIndexError, NegativeIndexError

from ._shape_bytes import decode_extent, decode_point

__all__ = [
    "DimensionError",
    "Extent",
    "MeshIndexError",
    "MeshTrait",
    "NDSlice",
    "Point",
    "Region",
    "Shape",
    "ShapedMesh",
    "Slice",
]

DimensionSources = Mapping[str, Sequence[str]]
"""For each dimension of a derived mesh, the dimensions of the original it was made from."""


def _as_size(value: object, what: str) -> int:
    """A non-negative int from anything int-like, so numpy ints work but floats do not."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None
    if number < 0:
        raise ValueError(f"{what} must be non-negative, got {number}")
    return number


def _row_major_strides(sizes: Sequence[int]) -> list[int]:
    strides = [1] * len(sizes)
    run = 1
    for dim in range(len(sizes) - 1, -1, -1):
        strides[dim] = run
        run *= sizes[dim]
    return strides


def _product(values: Iterable[int]) -> int:
    total = 1
    for value in values:
        total *= value
    return total


# --------------------------------------------------------------------------------------------
# NDSlice
# --------------------------------------------------------------------------------------------


@final
class NDSlice:
    """A row-major strided region of global ranks: ``offset + sum(coord[i] * strides[i])``.

    Dimensions need not be ordered by stride (a column-major slice is fine); they must only
    never name one rank twice. When they nest (sorted by stride, each dimension of size > 1
    starts beyond the span of the smaller ones, as in any mesh sliced without steps),
    ``coordinates`` is a greedy division. Stepped slices can interleave (``slice(0, 3, 2)`` of
    3 gpus on 2 hosts is ranks 0, 2, 3, 5); upstream rejects those, here they keep a
    rank -> position table instead.
    """

    __slots__ = ("_len", "_offset", "_order", "_positions", "_sizes", "_strides")

    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    _len: int
    _positions: dict[int, int] | None  # only for interleaved dimensions
    _order: list[int] | None  # cache of _greedy_order()

    def __init__(self, offset: int, sizes: Sequence[int], strides: Sequence[int]) -> None:
        offset = _as_size(offset, "offset")
        sizes_t = tuple(_as_size(size, "size") for size in sizes)
        strides_t = tuple(_as_size(stride, "stride") for stride in strides)
        if len(sizes_t) != len(strides_t):
            raise ValueError(f"invalid dims: expected {len(sizes_t)}, got {len(strides_t)}")
        self._offset = offset
        self._sizes = sizes_t
        self._strides = strides_t
        self._len = _product(sizes_t)
        self._positions = None
        self._order = None
        # Only dimensions of size > 1 occupy space; a size-1 dimension's stride is never used.
        space = 1
        for stride, size in sorted(
            (st, sz) for st, sz in zip(strides_t, sizes_t, strict=True) if sz > 1
        ):
            if space > stride:
                self._positions = self._position_table()
                break
            space = stride * size

    def _greedy_order(self) -> list[int]:
        """Dimensions of size > 1, largest stride first: the order ``coordinates`` divides in."""
        order = self._order
        if order is None:
            order = self._order = sorted(
                (d for d, size in enumerate(self._sizes) if size > 1),
                key=lambda d: self._strides[d],
                reverse=True,
            )
        return order

    def _position_table(self) -> dict[int, int]:
        positions: dict[int, int] = {}
        for position, rank in enumerate(self._rank_list()):
            if positions.setdefault(rank, position) != position:
                raise ValueError(
                    f"overlapping strides: rank {rank} appears twice in offset {self._offset}, "
                    f"sizes {list(self._sizes)}, strides {list(self._strides)}"
                )
        return positions

    @staticmethod
    def new_row_major(sizes: Sequence[int]) -> NDSlice:
        """The dense slice of ``sizes`` starting at rank 0."""
        return NDSlice(0, sizes, _row_major_strides([_as_size(s, "size") for s in sizes]))

    @staticmethod
    def from_list(ranks: Iterable[int]) -> list[NDSlice]:
        """One-dimensional slices covering ``ranks`` (sorted), each a maximal arithmetic run."""
        ordered = sorted({_as_size(rank, "rank") for rank in ranks})
        result: list[NDSlice] = []
        start = 0
        while start < len(ordered):
            end = start + 1
            stride = ordered[end] - ordered[start] if end < len(ordered) else 1
            while end < len(ordered) and ordered[end] - ordered[end - 1] == stride:
                end += 1
            result.append(
                NDSlice(ordered[start], [end - start], [stride if end - start > 1 else 1])
            )
            start = end
        return result

    @property
    def ndim(self) -> int:
        return len(self._sizes)

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def strides(self) -> list[int]:
        return list(self._strides)

    @property
    def nelements(self) -> int:
        return self._len

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        """Global ranks in row-major order of the coordinates (first dimension outermost)."""
        return iter(self._rank_list())

    def _rank_list(self) -> list[int]:
        if self._len == 0:
            return []
        ranks = [self._offset]
        for size, stride in zip(self._sizes, self._strides, strict=True):
            ranks = [base + i * stride for base in ranks for i in range(size)]
        return ranks

    def is_contiguous(self) -> bool:
        """Whether the ranks are ``offset, offset + 1, ...`` in row-major order."""
        if self._len == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True

    def _check_index(self, index: int) -> int:
        if not 0 <= index < self._len:
            raise MeshIndexError(f"index {index} out of range {self._len}")
        return index

    def get(self, index: int) -> int:
        """The global rank at row-major position ``index`` (inverse of ``index``)."""
        index = self._check_index(operator.index(index))
        rank = self._offset
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            index, coord = divmod(index, size)
            rank += coord * stride
        return rank

    @overload
    def __getitem__(self, i: SupportsIndex) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: SupportsIndex | slice) -> int | tuple[int, ...]:
        if isinstance(i, slice):
            return tuple(self.get(j) for j in range(*i.indices(self._len)))
        index = operator.index(i)
        if index < 0:
            # Upstream (usize) rejects negative positions rather than counting from the end.
            raise TypeError(f"negative index {index} is not supported")
        return self.get(index)

    def coordinates(self, value: int) -> list[int]:
        """Coordinates of global rank ``value``; ValueError if the slice does not hold it."""
        value = _unsigned(value)
        if self._positions is not None:
            position = self._positions.get(value)
            if position is None:
                raise ValueError(f"value {value} not in slice")
            coords = [0] * len(self._sizes)
            for dim in range(len(self._sizes) - 1, -1, -1):
                position, coords[dim] = divmod(position, self._sizes[dim])
            return coords
        pos = value - self._offset
        if pos < 0 or self._len == 0:
            raise ValueError(f"value {value} not in slice")
        coords = [0] * len(self._sizes)
        for dim in self._greedy_order():
            coord, pos = divmod(pos, self._strides[dim])
            if coord >= self._sizes[dim]:
                raise ValueError(f"value {value} not in slice")
            coords[dim] = coord
        if pos != 0:
            raise ValueError(f"value {value} not in slice")
        return coords

    def index(self, value: int) -> int:
        """Row-major position of global rank ``value``; ValueError if absent."""
        if self._positions is not None:
            found = self._positions.get(_unsigned(value))
            if found is None:
                raise ValueError(f"value {value} not in slice")
            return found
        position = 0
        for coord, size in zip(self.coordinates(value), self._sizes, strict=True):
            position = position * size + coord
        return position

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        try:
            self.coordinates(value)
        except ValueError:
            return False
        return True

    def nditem(self, coordinates: Sequence[int]) -> int:
        """The global rank at ``coordinates``; IndexError if they do not fit the slice."""
        if len(coordinates) != len(self._sizes):
            raise MeshIndexError(
                f"invalid dims: expected {len(self._sizes)}, got {len(coordinates)}"
            )
        rank = self._offset
        for coord, size, stride in zip(coordinates, self._sizes, self._strides, strict=True):
            coord = _unsigned(coord)
            if not coord < size:
                raise MeshIndexError(f"index {coord} out of range {size}")
            rank += coord * stride
        return rank

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NDSlice):
            return NotImplemented
        return (self._offset, self._sizes, self._strides) == (
            other._offset,
            other._sizes,
            other._strides,
        )

    def __hash__(self) -> int:
        return hash((self._offset, self._sizes, self._strides))

    def __reduce__(self) -> tuple[Any, ...]:
        return (NDSlice, (self._offset, list(self._sizes), list(self._strides)))

    def __repr__(self) -> str:
        sizes = ", ".join(map(str, self._sizes))
        strides = ", ".join(map(str, self._strides))
        return f"Slice {{ offset: {self._offset}, sizes: [{sizes}], strides: [{strides}] }}"


Slice = NDSlice
"""Upstream's Rust name for the same type."""


# --------------------------------------------------------------------------------------------
# Extent, Point, Region
# --------------------------------------------------------------------------------------------


def _fmt_label(label: str) -> str:
    """Bare if ``[A-Za-z0-9_]+``, else a double-quoted literal, as upstream prints labels."""
    if label and all(c == "_" or (c.isascii() and c.isalnum()) for c in label):
        return label
    return _debug_str(label)


def _debug_str(text: str) -> str:
    """``text`` as a double-quoted, escaped literal (the form upstream's Rust reprs use)."""
    out = []
    for c in text:
        if c in '\\"':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif not c.isprintable():
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _check_labels(labels: Iterable[str]) -> tuple[str, ...]:
    result = tuple(labels)
    for label in result:
        if not isinstance(label, str):
            raise TypeError(f"dimension labels must be str, not {type(label).__name__}")
    if len(set(result)) != len(result):
        raise ValueError(f"invalid labels {list(result)!r}: duplicate dimension name")
    return result


def _unsigned(value: SupportsIndex) -> int:
    """An index or rank as upstream takes it (an unsigned int): negatives are refused first,
    with upstream's OverflowError and words."""
    index = operator.index(value)
    if index < 0:
        raise NegativeIndexError("can't convert negative int to unsigned")
    return index


def _missing(label: object, labels: Sequence[str]) -> DimensionError:
    return DimensionError(f"Dimension {label!r} not found (dimensions: {list(labels)!r})")


@final
class Extent(Mapping[str, int]):
    """The sizes of a mesh's named dimensions, in order: ``{hosts: 2, gpus: 4}``."""

    __slots__ = ("_labels", "_sizes")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        labels_t = _check_labels(labels)
        sizes_t = tuple(_as_size(size, "size") for size in sizes)
        if len(labels_t) != len(sizes_t):
            raise ValueError(f"label/sizes dimension mismatch: {len(labels_t)} != {len(sizes_t)}")
        self._labels = labels_t
        self._sizes = sizes_t

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def nelements(self) -> int:
        return _product(self._sizes)

    @property
    def region(self) -> Region:
        """The dense region of this extent (ranks ``0 .. nelements``)."""
        return Region(self._labels, NDSlice.new_row_major(self._sizes))

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise _missing(label, self._labels) from None

    def __len__(self) -> int:
        return len(self._labels)

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __contains__(self, label: object) -> bool:
        return label in self._labels

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Extent):
            return NotImplemented
        return self._labels == other._labels and self._sizes == other._sizes

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Extent, (list(self._labels), list(self._sizes)))

    @staticmethod
    def from_bytes(data: bytes) -> Extent:
        """The extent upstream's pickled form holds (``Extent.from_bytes(bincode)``)."""
        labels, sizes = decode_extent(data)
        return Extent(labels, sizes)

    def __repr__(self) -> str:
        body = ", ".join(
            f"{_fmt_label(lb)}: {sz}" for lb, sz in zip(self._labels, self._sizes, strict=True)
        )
        return "{" + body + "}"

    __str__ = __repr__


@final
class Point(Mapping[str, int]):
    """A position in an extent: a read-only mapping label -> coordinate.

    ``rank`` is the row-major linear index within the extent (not a global rank), so
    ``mesh.slice(**point)`` selects the member a point names.
    """

    __slots__ = ("_coords", "_extent", "_rank")

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...] | None

    def __init__(self, rank: int, extent: Extent) -> None:
        rank = _as_size(rank, "rank")
        if not isinstance(extent, Extent):
            raise TypeError(f"extent must be an Extent, not {type(extent).__name__}")
        total = extent.nelements
        if rank >= total:
            raise MeshIndexError(f"out of range: total ranks {total}; does not contain rank {rank}")
        self._rank = rank
        self._extent = extent
        self._coords = None  # computed on first use: most points are only passed along

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def extent(self) -> Extent:
        return self._extent

    def _coordinates(self) -> tuple[int, ...]:
        if self._coords is None:
            coords: list[int] = []
            rest = self._rank
            for size in reversed(self._extent._sizes):
                rest, coord = divmod(rest, size)
                coords.append(coord)
            self._coords = tuple(reversed(coords))
        return self._coords

    def size(self, label: str) -> int:
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        try:
            dim = self._extent._labels.index(label)
        except ValueError:
            raise _missing(label, self._extent._labels) from None
        return self._coordinates()[dim]

    def __len__(self) -> int:
        return len(self._extent)

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent._labels)

    def __contains__(self, label: object) -> bool:
        return label in self._extent._labels

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Point):
            return NotImplemented
        return self._rank == other._rank and self._extent == other._extent

    def __hash__(self) -> int:
        return hash((self._rank, self._extent))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Point, (self._rank, self._extent))

    @staticmethod
    def from_bytes(data: bytes) -> Point:
        """The point upstream's pickled form holds (``Point.from_bytes(bincode)``)."""
        rank, labels, sizes = decode_point(data)
        return Point(rank, Extent(labels, sizes))

    def __repr__(self) -> str:
        parts = (
            f"'{label}': {coord}/{size}"
            for label, coord, size in zip(
                self._extent._labels, self._coordinates(), self._extent._sizes, strict=True
            )
        )
        return "{" + ", ".join(parts) + "}"


@final
class Region:
    """Labelled ranks of a larger space (upstream's lighter cousin of Shape)."""

    __slots__ = ("_labels", "_slice")

    _labels: tuple[str, ...]
    _slice: NDSlice

    def __init__(self, labels: Sequence[str], slice: NDSlice) -> None:
        labels_t = _check_labels(labels)
        if len(labels_t) != slice.ndim:
            raise ValueError(f"label slice dimension mismatch: {len(labels_t)} != {slice.ndim}")
        self._labels = labels_t
        self._slice = slice

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    def slice(self) -> NDSlice:
        return self._slice

    def as_shape(self) -> Shape:
        return Shape(self._labels, self._slice)

    @property
    def extent(self) -> Extent:
        return Extent(self._labels, self._slice._sizes)

    def point_of_base_rank(self, rank: int) -> Point:
        """The point of global rank ``rank`` within this region; ValueError if absent."""
        return Point(self._slice.index(rank), self.extent)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Region):
            return NotImplemented
        return self._labels == other._labels and self._slice == other._slice

    def __hash__(self) -> int:
        return hash((self._labels, self._slice))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Region, (list(self._labels), self._slice))

    def __repr__(self) -> str:
        return f"Region {{ labels: {list(self._labels)!r}, slice: {self._slice!r} }}"


# --------------------------------------------------------------------------------------------
# Shape
# --------------------------------------------------------------------------------------------


@final
class Shape:
    """Labels for the dimensions of an NDSlice: the full description of a mesh's ranks.

    Every operation returns a new Shape selecting a subset (or a relabelling) of the same
    global ranks; ``len(shape)`` counts them and ``ranks()`` lists them in row-major order.
    """

    __slots__ = ("_labels", "_ndslice")

    _labels: tuple[str, ...]
    _ndslice: NDSlice

    def __init__(self, labels: Sequence[str], slice: NDSlice) -> None:
        if not isinstance(slice, NDSlice):
            raise TypeError(f"slice must be an NDSlice, not {type(slice).__name__}")
        labels_t = _check_labels(labels)
        if len(labels_t) != slice.ndim:
            raise ValueError(f"label slice dimension mismatch: {len(labels_t)} != {slice.ndim}")
        self._labels = labels_t
        self._ndslice = slice

    @staticmethod
    def unity() -> Shape:
        """The zero-dimensional shape of the single rank 0."""
        return Shape((), NDSlice(0, (), ()))

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @property
    def ndslice(self) -> NDSlice:
        return self._ndslice

    @property
    def extent(self) -> Extent:
        return Extent(self._labels, self._ndslice._sizes)

    @property
    def region(self) -> Region:
        return Region(self._labels, self._ndslice)

    def __len__(self) -> int:
        return len(self._ndslice)

    def ranks(self) -> list[int]:
        """The global ranks of this shape in row-major order."""
        return list(self._ndslice)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Labelled coordinates of global rank ``rank``; ValueError if the shape lacks it."""
        return dict(zip(self._labels, self._ndslice.coordinates(rank), strict=True))

    def rank_of(self, coords: Mapping[str, int] | Sequence[int]) -> int:
        """The global rank at ``coords`` (every dimension, by label or in order)."""
        if isinstance(coords, Mapping):
            extra = [label for label in coords if label not in self._labels]
            if extra:
                raise _missing(extra[0], self._labels)
            try:
                ordered = [coords[label] for label in self._labels]
            except KeyError as e:
                raise DimensionError(
                    f"coordinates lack dimension {e.args[0]!r} (dimensions: {list(self._labels)!r})"
                ) from None
            return self._ndslice.nditem(ordered)
        return self._ndslice.nditem(list(coords))

    def _dim(self, label: str) -> int:
        try:
            return self._labels.index(label)
        except ValueError:
            raise DimensionError(
                f"Shape does not have dimension labeled {label!r} (dimensions: "
                f"{list(self._labels)!r})"
            ) from None

    def at(self, label: str, index: int) -> Shape:
        """Fix dimension ``label`` at ``index`` and drop it."""
        index = _unsigned(index)
        dim = self._dim(label)
        size = self._ndslice._sizes[dim]
        if not 0 <= index < size:
            raise MeshIndexError(
                f"index {index} out of range for dimension {label!r} of size {size}"
            )
        s = self._ndslice
        return Shape(
            self._labels[:dim] + self._labels[dim + 1 :],
            NDSlice(
                s._offset + index * s._strides[dim],
                s._sizes[:dim] + s._sizes[dim + 1 :],
                s._strides[:dim] + s._strides[dim + 1 :],
            ),
        )

    def select(self, label: str, selector: slice | int) -> Shape:
        """Restrict ``label`` to ``selector``: a slice keeps the dimension (renumbered from 0),
        an int drops it like ``at``."""
        if not isinstance(selector, slice):
            # Slicing a mesh calls -1 out of range, as upstream's MeshTrait (``at`` overflows).
            index = operator.index(selector)
            size = self._ndslice._sizes[self._dim(label)]
            if index < 0:
                raise MeshIndexError(
                    f"index {index} out of range for dimension {label!r} of size {size}"
                )
            return self.at(label, index)
        dim = self._dim(label)
        s = self._ndslice
        size = s._sizes[dim]
        start, stop, step = selector.indices(size)
        if step < 0:
            raise ValueError(f"negative step {step} is not supported (dimension {label!r})")
        if start >= size:
            raise MeshIndexError(
                f"out of range {start}:{stop}:{step} for dimension {label!r} of size {size}"
            )
        if stop <= start:
            raise ValueError(f"empty range {start}:{stop}:{step} for dimension {label!r}")
        sizes = list(s._sizes)
        strides = list(s._strides)
        sizes[dim] = -(-(stop - start) // step)
        strides[dim] *= step
        return Shape(self._labels, NDSlice(s._offset + start * s._strides[dim], sizes, strides))

    def index(self, **kwargs: int) -> Shape:
        """Fix several dimensions at once, dropping them: ``shape.index(gpu=3, host=0)``."""
        shape = self
        for label, index in kwargs.items():
            shape = shape.at(label, index)
        return shape

    def slice(self, **kwargs: slice | int) -> Shape:
        """Select along named dimensions: ints drop the dimension, slices keep it."""
        shape = self
        for label, selector in kwargs.items():
            shape = shape.select(label, selector)
        return shape

    def _split(self, kwargs: Mapping[str, Any]) -> tuple[Shape, dict[str, tuple[str, ...]]]:
        splits: dict[str, tuple[str, ...]] = {}
        constraints: dict[str, int] = {}
        for key, value in kwargs.items():
            if key in self._labels:
                if isinstance(value, str) or not isinstance(value, Iterable):
                    raise ValueError(f"expected a sequence of dimensions, but got {value!r}")
                names = tuple(value)
                if not names or not all(isinstance(n, str) for n in names):
                    raise ValueError(
                        f"dimension {key!r} must split into one or more names, got {value!r}"
                    )
                splits[key] = names
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise DimensionError(
                        f"{key!r} is not an existing dim (dimensions: {list(self._labels)!r}). "
                        "Expected an integer size constraint on a new dim."
                    )
                if value <= 0:
                    raise ValueError(f"size constraint {key}={value} must be positive")
                constraints[key] = value

        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        sources: dict[str, tuple[str, ...]] = {}
        s = self._ndslice
        for label, size, stride in zip(self._labels, s._sizes, s._strides, strict=True):
            names = splits.get(label, (label,))
            for name in names:
                if name in sources or names.count(name) > 1:
                    raise ValueError(f"Duplicate dimension name '{name}'")
            known = 1
            unknown: str | None = None
            for name in names:
                if name in constraints:
                    known *= constraints[name]
                elif unknown is None:
                    unknown = name
                else:
                    raise ValueError(
                        f"Cannot infer size of {names} because both {name} and {unknown} have "
                        f"unknown size. Specify at least one as argument, e.g. {name}=4"
                    )
            if unknown is not None:
                inferred, rest = divmod(size, known)
                if rest:
                    given = tuple(constraints.get(n, "?") for n in names)
                    raise ValueError(
                        f"Dimension '{label}' of size {size} is not evenly divided by "
                        f"{names!r} with sizes {given!r}"
                    )
                constraints[unknown] = inferred
            elif known != size:
                given = tuple(constraints[n] for n in names)
                raise ValueError(
                    f"Dimension '{label}' of size {size} is not evenly divided by {names!r} "
                    f"with sizes {given!r}"
                )
            new_sizes = [constraints.pop(name) for name in names]
            new_strides = []
            run = stride
            for new_size in reversed(new_sizes):
                new_strides.append(run)
                run *= new_size
            labels.extend(names)
            sizes.extend(new_sizes)
            strides.extend(reversed(new_strides))
            for name in names:
                sources[name] = (label,)
        if constraints:
            raise ValueError(f"unused size constraints: {tuple(constraints)}")
        return Shape(labels, NDSlice(s._offset, sizes, strides)), sources

    def split(self, **kwargs: Any) -> Shape:
        """Split dimensions into several: ``split(host=("dp", "pp"), pp=2)``; one size may be
        left out and is inferred."""
        return self._split(kwargs)[0]

    def rename(self, **kwargs: str) -> Shape:
        """Rename dimensions: ``rename(host="dp")``; others keep their names."""
        return self._split(_renames(kwargs))[0]

    def _flatten(self, name: str) -> tuple[Shape, dict[str, tuple[str, ...]]]:
        s = self._ndslice
        if not s.is_contiguous():
            raise ValueError(
                f"cannot flatten sparse mesh: strides {list(s._strides)} != dense strides "
                f"{_row_major_strides(s._sizes)} for sizes {list(s._sizes)}"
            )
        shape = Shape((name,), NDSlice(s._offset, (len(s),), (1,)))
        return shape, {name: self._labels}

    def flatten(self, name: str) -> Shape:
        """All dimensions as one, ``name``; only for dense (contiguous) shapes."""
        return self._flatten(name)[0]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._labels == other._labels and self._ndslice == other._ndslice

    def __hash__(self) -> int:
        return hash((self._labels, self._ndslice))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Shape, (list(self._labels), self._ndslice))

    def __str__(self) -> str:
        dims = (
            f"{label}={size}"
            for label, size in zip(self._labels, self._ndslice._sizes, strict=True)
        )
        return "{" + ",".join(dims) + "}"

    def __repr__(self) -> str:
        labels = ", ".join(_debug_str(label) for label in self._labels)
        return f"Shape {{ labels: [{labels}], slice: {self._ndslice!r} }}"


def _renames(kwargs: Mapping[str, object]) -> dict[str, tuple[str, ...]]:
    renames: dict[str, tuple[str, ...]] = {}
    for old, new in kwargs.items():
        if not isinstance(new, str):
            raise ValueError(f"rename {old}= expects a new dimension name, got {new!r}")
        renames[old] = (new,)
    return renames


# --------------------------------------------------------------------------------------------
# MeshTrait
# --------------------------------------------------------------------------------------------


class MeshTrait(ABC):
    """Slicing, splitting, flattening and renaming for anything laid out as a Shape.

    Implementers provide ``_ndslice``, ``_labels`` and ``_new_with_shape``; every operation
    here only ever asks ``_new_with_shape`` for a shape over a subset of the current global
    ranks (or the same ranks relabelled). ``_new_with_shape_from`` also receives, for each new
    dimension, the old dimensions it came from, for meshes that track per-dimension state.
    """

    __slots__ = ()

    @property
    @abstractmethod
    def _ndslice(self) -> NDSlice: ...

    @property
    @abstractmethod
    def _labels(self) -> Sequence[str]: ...

    @abstractmethod
    def _new_with_shape(self, shape: Shape) -> Self: ...

    def _new_with_shape_from(self, shape: Shape, sources: DimensionSources) -> Self:
        return self._new_with_shape(shape)

    def _mesh_shape(self) -> Shape:
        return Shape(tuple(self._labels), self._ndslice)

    def slice(self, **kwargs: slice | int) -> Self:
        """Select along named dimensions: ``mesh.slice(batch=3, gpu=slice(2, 6))``. An int
        removes the dimension; a slice keeps it, renumbered from 0."""
        shape = self._mesh_shape().slice(**kwargs)
        return self._new_with_shape_from(shape, {name: (name,) for name in shape._labels})

    def split(self, **kwargs: Any) -> Self:
        """Split dimensions: ``mesh.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=16, cp=2)``."""
        shape, sources = self._mesh_shape()._split(kwargs)
        return self._new_with_shape_from(shape, sources)

    def flatten(self, name: str) -> Self:
        """All dimensions as one named ``name``; only for dense meshes."""
        shape, sources = self._mesh_shape()._flatten(name)
        return self._new_with_shape_from(shape, sources)

    def rename(self, **kwargs: str) -> Self:
        """Rename dimensions: ``mesh.rename(host="dp", gpu="tp")``."""
        shape, sources = self._mesh_shape()._split(_renames(kwargs))
        return self._new_with_shape_from(shape, sources)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Number of members: all of them, along one dimension, or along several."""
        labels = list(self._labels)
        if dim is None:
            return len(self._ndslice)
        if isinstance(dim, str):
            try:
                return self._ndslice._sizes[labels.index(dim)]
            except ValueError:
                raise DimensionError(
                    f"mesh does not have dimension {dim!r} (dimensions: {labels!r})"
                ) from None
        return _product(self.size(d) for d in dim)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self._labels, self._ndslice._sizes, strict=True))

    @property
    def extent(self) -> Extent:
        return Extent(tuple(self._labels), self._ndslice._sizes)

    def __len__(self) -> int:
        return len(self._ndslice)


class ShapedMesh(MeshTrait):
    """A mesh that keeps its Shape in ``_shape``: the MeshTrait hooks read it from there."""

    _shape: Shape

    @property
    def _ndslice(self) -> NDSlice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels
