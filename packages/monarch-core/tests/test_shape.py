"""The slicing algebra: NDSlice, Extent, Point, Shape, MeshTrait (Selection: test_dropin_meshes)."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core._layout._shape import (
    DimensionError,
    Extent,
    MeshIndexError,
    MeshTrait,
    NDSlice,
    Point,
    Region,
    Shape,
    Slice,
)

FAST = settings(max_examples=60, deadline=None)


class Mesh(MeshTrait):
    """The smallest MeshTrait: a shape and nothing else (as upstream's test_mesh_trait)."""

    def __init__(self, shape: Shape) -> None:
        self._shape = shape

    @property
    def _ndslice(self) -> NDSlice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels

    def _new_with_shape(self, shape: Shape) -> Mesh:
        return Mesh(shape)


# -- strategies ------------------------------------------------------------------------------


@st.composite
def ndslices(draw: st.DrawFn, max_dims: int = 3, max_size: int = 5) -> NDSlice:
    """Valid slices: dimensions nested in a random order, with gaps, at a random offset."""
    ndim = draw(st.integers(0, max_dims))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=ndim, max_size=ndim))
    order = draw(st.permutations(range(ndim)))
    gaps = st.sampled_from([1, 2, 3]) if draw(st.booleans()) else st.just(1)
    strides = [0] * ndim
    run = 1
    for dim in order:  # innermost first
        strides[dim] = run * draw(gaps)
        run = strides[dim] * sizes[dim]
    s = NDSlice(draw(st.integers(0, 20)), sizes, strides)
    if ndim and draw(st.booleans()):
        # step through one dimension: this can interleave it with another (position table)
        dim = draw(st.integers(0, ndim - 1))
        labels = [f"d{i}" for i in range(ndim)]
        step = slice(draw(st.integers(0, sizes[dim] - 1)), None, draw(st.integers(2, 3)))
        s = Shape(labels, s).select(labels[dim], step).ndslice
    return s


@st.composite
def interleaved_ndslices(draw: st.DrawFn) -> NDSlice:
    """A stepped slice whose dimensions interleave: ``gpus=slice(0, 3, 2)`` of [2, 3] is
    ranks 0, 2, 3, 5 (outer stride 3 < inner span 4)."""
    outer = draw(st.integers(2, 4))
    inner = draw(st.sampled_from([3, 5, 7]))
    step = draw(st.integers(2, inner - 1).filter(lambda k: inner % k != 0))
    base = Shape(["o", "i"], NDSlice(draw(st.integers(0, 9)), [outer, inner], [inner, 1]))
    s = base.select("i", slice(0, None, step)).ndslice
    if draw(st.booleans()):  # the same region, column-major
        s = NDSlice(s.offset, s.sizes[::-1], s.strides[::-1])
    return s


def any_ndslices() -> st.SearchStrategy[NDSlice]:
    return st.one_of(ndslices(), interleaved_ndslices())


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    s = draw(any_ndslices())
    return Shape([f"d{i}" for i in range(s.ndim)], s)


@st.composite
def dense_shapes(draw: st.DrawFn, max_dims: int = 3, max_size: int = 4) -> Shape:
    ndim = draw(st.integers(0, max_dims))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=ndim, max_size=ndim))
    s = NDSlice.new_row_major(sizes)
    return Shape(
        [f"d{i}" for i in range(ndim)], NDSlice(draw(st.integers(0, 9)), s.sizes, s.strides)
    )


def selectors(size: int) -> st.SearchStrategy[int | slice]:
    """A valid (non-empty) selector of a dimension of ``size``: an index or a forward slice."""
    ints = st.integers(0, size - 1)
    slices = st.integers(0, size - 1).flatmap(
        lambda start: st.builds(
            slice, st.just(start), st.integers(start + 1, size + 2), st.integers(1, 3)
        )
    )
    return st.one_of(ints, slices)


def reference_ranks(shape: Shape, selections: dict[str, int | slice]) -> list[int]:
    """The ranks a selection picks, computed the slow way: Python indexing of each dimension."""
    picks: list[list[int]] = []
    for label, size in zip(shape.labels, shape.ndslice.sizes, strict=True):
        sel = selections.get(label, slice(None))
        picks.append([sel] if isinstance(sel, int) else list(range(size))[sel])
    s = shape.ndslice
    return [s.nditem(list(coords)) for coords in itertools.product(*picks)]


# -- NDSlice ---------------------------------------------------------------------------------


@FAST
@given(any_ndslices())
def test_slice_rank_coordinate_bijection(s: NDSlice) -> None:
    ranks = list(s)
    assert len(ranks) == len(s) == s.nelements == len(set(ranks))
    for i, rank in enumerate(ranks):
        assert s[i] == s.get(i) == rank
        assert s.index(rank) == i
        coords = s.coordinates(rank)
        assert s.nditem(coords) == rank
        assert rank in s
        # row-major: position i is the coordinates read as a mixed-radix number
        assert coords == list(
            next(itertools.islice(itertools.product(*map(range, s.sizes)), i, None))
        )
    for value in range(min(ranks), max(ranks) + 1):
        if value not in ranks:
            assert value not in s
            with pytest.raises(ValueError, match="not in slice"):
                s.index(value)
    with pytest.raises(IndexError):
        s[len(s)]


@FAST
@given(any_ndslices())
def test_slice_pickle_eq_hash(s: NDSlice) -> None:
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s and hash(copy) == hash(s)
    assert list(copy) == list(s)


def test_slice_examples_from_upstream() -> None:
    s = NDSlice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert [s[i] for i in range(4)] == [0, 1, 2, 3]
    assert list(s) == list(range(6))
    assert NDSlice(offset=0, sizes=[2, 2, 2], strides=[4, 32, 1])[2] == 32
    s = NDSlice(offset=10, sizes=[10, 2], strides=[10, 5])
    assert list(s) == list(range(10, 106, 5))
    assert s.coordinates(10) == [0, 0]
    with pytest.raises(ValueError, match="not in slice"):
        s.coordinates(6)
    assert NDSlice(offset=0, sizes=[2, 2], strides=[4, 2]).index(2) == 1
    assert list(NDSlice(offset=37, sizes=[], strides=[])) == [37]
    assert Slice is NDSlice
    assert NDSlice(0, [2, 3], [3, 1]) == s.new_row_major([2, 3])  # positional form too


def test_slice_repr_and_getitem_errors() -> None:
    s = NDSlice(offset=0, sizes=[2, 3], strides=[3, 1])
    assert repr(s) == str(s) == "Slice { offset: 0, sizes: [2, 3], strides: [3, 1] }"
    with pytest.raises(TypeError):
        s[-1]  # upstream: no negative positions
    with pytest.raises(IndexError):
        s[6]
    assert s[1:4] == (1, 2, 3)
    with pytest.raises(IndexError):
        s.nditem([2, 0])
    with pytest.raises(IndexError):
        s.nditem([0])


@pytest.mark.parametrize(
    ("sizes", "strides"),
    [([2, 2], [1, 1]), ([3, 2], [1, 2]), ([2], [0]), ([2, 3], [3]), ([2, 3], [2, 1])],
)
def test_slice_rejects_overlap(sizes: list[int], strides: list[int]) -> None:
    with pytest.raises(ValueError, match=r"overlapping strides|invalid dims"):
        NDSlice(0, sizes, strides)


def test_interleaved_steps_are_supported() -> None:
    """Upstream rejects these (non-rectangular); they name distinct ranks, so keep them."""
    mesh = Mesh(Shape(["hosts", "gpus"], NDSlice.new_row_major([2, 3])))
    stepped = mesh.slice(gpus=slice(0, 3, 2))
    assert stepped._shape.ranks() == [0, 2, 3, 5] and stepped.sizes == {"hosts": 2, "gpus": 2}
    s = stepped._ndslice
    assert [s.index(r) for r in [0, 2, 3, 5]] == [0, 1, 2, 3] and s.coordinates(3) == [1, 0]
    assert 4 not in s and stepped.slice(gpus=1)._shape.ranks() == [2, 5]
    with pytest.raises(ValueError, match="sparse"):
        stepped.flatten("r")
    wide = Mesh(Shape(["a", "b"], NDSlice.new_row_major([4, 6]))).slice(b=slice(None, None, 4))
    assert wide._shape.ranks() == [0, 4, 6, 10, 12, 16, 18, 22]


def test_slice_from_list() -> None:
    assert NDSlice.from_list([]) == []
    assert NDSlice.from_list([1, 3, 5]) == [NDSlice(1, [3], [2])]
    assert NDSlice.from_list([1, 2, 4, 5, 6]) == [NDSlice(1, [2], [1]), NDSlice(4, [3], [1])]
    assert NDSlice.from_list(range(100)) == [NDSlice(0, [100], [1])]


# -- Extent and Point ------------------------------------------------------------------------


def test_extent_repr_and_mapping() -> None:
    assert repr(Extent(["gpus"], [2])) == "{gpus: 2}"
    assert str(Extent(["hosts", "gpus"], [2, 4])) == "{hosts: 2, gpus: 4}"
    assert repr(Extent([], [])) == "{}"
    assert repr(Extent(["dim/0", "x y"], [3, 5])) == '{"dim/0": 3, "x y": 5}'
    e = Extent(["hosts", "gpus"], [2, 4])
    assert e["gpus"] == 4 and e.nelements == 8 and len(e) == 2
    assert list(e) == e.labels == ["hosts", "gpus"] and e.sizes == [2, 4]
    assert dict(e.items()) == {"hosts": 2, "gpus": 4} and list(e.values()) == [2, 4]
    assert list(e.keys()) == ["hosts", "gpus"]
    assert e.region.as_shape() == Shape(["hosts", "gpus"], NDSlice.new_row_major([2, 4]))
    assert e == Extent(["hosts", "gpus"], [2, 4]) != Extent(["gpus", "hosts"], [4, 2])
    assert pickle.loads(pickle.dumps(e)) == e
    for exc in (KeyError, ValueError):
        with pytest.raises(exc, match="'procs' not found"):
            e["procs"]
    assert "procs" not in e and e.get("procs") is None
    with pytest.raises(ValueError, match="mismatch"):
        Extent(["a"], [1, 2])


def test_point_repr_and_mapping() -> None:
    p = Point(0, Extent(["gpus"], [2]))
    assert repr(p) == "{'gpus': 0/2}"
    assert repr(Point(0, Extent([], []))) == "{}"
    p = Point(5, Extent(["hosts", "gpus"], [2, 4]))
    assert repr(p) == "{'hosts': 1/2, 'gpus': 1/4}"
    assert p.rank == 5 and p.extent == Extent(["hosts", "gpus"], [2, 4])
    assert p["hosts"] == 1 and p["gpus"] == 1 and p.size("gpus") == 4
    assert dict(p) == {"hosts": 1, "gpus": 1} and list(p.keys()) == ["hosts", "gpus"]
    assert list(p.values()) == [1, 1] and len(p) == 2
    assert p == Point(5, Extent(["hosts", "gpus"], [2, 4])) != Point(4, p.extent)
    assert hash(p) == hash(Point(5, p.extent))
    assert pickle.loads(pickle.dumps(p)) == p
    assert "procs" not in p
    with pytest.raises(ValueError, match="'procs' not found"):
        p["procs"]
    with pytest.raises(ValueError, match="'procs' not found"):
        p.size("procs")
    with pytest.raises(ValueError, match="out of range"):
        Point(8, p.extent)


@FAST
@given(shapes())
def test_point_rank_is_row_major_position(shape: Shape) -> None:
    extent = shape.extent
    for i, rank in enumerate(shape.ranks()):
        p = Point(i, extent)
        assert shape.rank_of(dict(p)) == rank
        assert shape.coordinates(rank) == dict(p)
        assert extent.region.point_of_base_rank(i) == p
        assert shape.region.point_of_base_rank(rank) == p


# -- Shape -----------------------------------------------------------------------------------


def test_shape_repr_and_basics() -> None:
    s = Shape(["label0", "label1"], NDSlice(offset=0, sizes=[2, 3], strides=[3, 1]))
    assert str(s) == "{label0=2,label1=3}"
    assert repr(s) == (
        'Shape { labels: ["label0", "label1"], slice: Slice { offset: 0, sizes: [2, 3], '
        "strides: [3, 1] } }"
    )
    assert len(s) == 6 and s.ranks() == list(range(6))
    assert s.extent == Extent(["label0", "label1"], [2, 3])
    assert (
        Shape.unity().ranks() == [0] and Shape.unity().labels == [] and str(Shape.unity()) == "{}"
    )
    assert pickle.loads(pickle.dumps(s)) == s and hash(pickle.loads(pickle.dumps(s))) == hash(s)
    with pytest.raises(ValueError, match="mismatch"):
        Shape(["a"], NDSlice(0, [2, 3], [3, 1]))
    with pytest.raises(ValueError, match="duplicate"):
        Shape(["a", "a"], NDSlice(0, [2, 3], [3, 1]))
    with pytest.raises(ValueError, match="not in slice"):
        s.coordinates(6)
    with pytest.raises(KeyError):
        s.rank_of({"label0": 1})
    assert s.rank_of([1, 2]) == 5 == s.rank_of({"label1": 2, "label0": 1})


def test_shape_select_at_index() -> None:
    s = Shape(["hosts", "gpus"], NDSlice.new_row_major([2, 4]))
    assert s.at("hosts", 1).ranks() == [4, 5, 6, 7] and s.at("hosts", 1).labels == ["gpus"]
    assert s.select("gpus", slice(1, None, 2)).ranks() == [1, 3, 5, 7]
    assert s.select("gpus", slice(1, None, 2)).labels == ["hosts", "gpus"]
    assert s.select("gpus", 3).ranks() == [3, 7]
    assert s.index(hosts=1, gpus=2).ranks() == [6]
    assert s.slice(hosts=1, gpus=slice(-2, None)).ranks() == [6, 7]


@FAST
@given(shapes(), st.data())
def test_slice_of_slice_is_composed_slice(shape: Shape, data: st.DataObject) -> None:
    if not shape.labels:
        return
    label = data.draw(st.sampled_from(shape.labels))
    size = shape.extent[label]
    first = data.draw(selectors(size))
    once = shape.slice(**{label: first})
    assert once.ranks() == reference_ranks(shape, {label: first})
    if isinstance(first, int):
        return
    kept = range(size)[first]
    second = data.draw(selectors(len(kept)))
    twice = once.slice(**{label: second})
    composed = kept[second]
    direct = (
        composed
        if isinstance(composed, int)
        else slice(composed.start, composed.stop, composed.step)
    )
    assert twice.ranks() == shape.slice(**{label: direct}).ranks()
    assert twice.ranks() == reference_ranks(shape, {label: direct})


@FAST
@given(shapes(), st.data())
def test_multi_dim_slice_matches_reference(shape: Shape, data: st.DataObject) -> None:
    selection = {
        label: data.draw(selectors(size))
        for label, size in zip(shape.labels, shape.ndslice.sizes, strict=True)
        if data.draw(st.booleans())
    }
    sliced = shape.slice(**selection)
    assert sliced.ranks() == reference_ranks(shape, selection)
    assert sliced.labels == [
        label for label in shape.labels if not isinstance(selection.get(label), int)
    ]


@FAST
@given(dense_shapes())
def test_flatten_then_split_restores(shape: Shape) -> None:
    flat = shape.flatten("flat")
    assert flat.ranks() == shape.ranks() and flat.labels == ["flat"]
    if not shape.labels:
        return
    sizes = dict(zip(shape.labels, shape.ndslice.sizes, strict=True))
    # give every size but the first; split infers it
    restored = flat.split(flat=tuple(shape.labels), **dict(list(sizes.items())[1:]))
    assert restored == shape


@FAST
@given(shapes(), st.data())
def test_split_then_flatten_keeps_ranks(shape: Shape, data: st.DataObject) -> None:
    if not shape.labels:
        return
    label = data.draw(st.sampled_from(shape.labels))
    size = shape.extent[label]
    inner = data.draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
    split = shape.split(**{label: ("outer", "inner")}, inner=inner)
    assert split.ranks() == shape.ranks()
    assert split.extent["outer"] * split.extent["inner"] == size
    assert split.split(outer=(label + "_o",)).ranks() == shape.ranks()
    if shape.ndslice.is_contiguous():
        assert split.flatten("f") == shape.flatten("f")


@FAST
@given(shapes())
def test_rename_keeps_ranks(shape: Shape) -> None:
    renamed = shape.rename(**{label: label.upper() for label in shape.labels})
    assert renamed.ranks() == shape.ranks()
    assert renamed.ndslice == shape.ndslice
    assert renamed.labels == [label.upper() for label in shape.labels]


def test_flatten_rejects_sparse() -> None:
    s = Shape(["hosts", "gpus"], NDSlice.new_row_major([2, 4])).slice(gpus=slice(0, 4, 2))
    with pytest.raises(ValueError, match="sparse"):
        s.flatten("r")
    # a single row of a dense mesh is still dense
    assert Shape(["h", "g"], NDSlice.new_row_major([2, 4])).slice(h=slice(1, 2)).flatten(
        "r"
    ).ranks() == [4, 5, 6, 7]


# -- MeshTrait -------------------------------------------------------------------------------


def mesh24() -> Mesh:
    return Mesh(Shape(["hosts", "gpus"], NDSlice.new_row_major([2, 4])))


@FAST
@given(shapes())
def test_full_slice_is_identity(shape: Shape) -> None:
    mesh = Mesh(shape)
    same = mesh.slice(**{label: slice(None) for label in shape.labels})
    assert same._shape == shape
    assert mesh.slice()._shape == shape


def test_mesh_trait_ops() -> None:
    mesh = mesh24()
    assert len(mesh) == 8 and mesh.size() == 8 and mesh.size("gpus") == 4
    assert mesh.size(["hosts", "gpus"]) == 8
    assert mesh.sizes == {"hosts": 2, "gpus": 4} and mesh.extent == Extent(
        ["hosts", "gpus"], [2, 4]
    )
    one = mesh.slice(hosts=1)
    assert one.sizes == {"gpus": 4} and one._shape.ranks() == [4, 5, 6, 7]
    kept = mesh.slice(hosts=slice(1, 2), gpus=slice(1, 3))
    assert kept.sizes == {"hosts": 1, "gpus": 2} and kept._shape.ranks() == [5, 6]
    split = mesh.split(gpus=("dp", "tp"), tp=2)
    assert split.sizes == {"hosts": 2, "dp": 2, "tp": 2} and split._shape.ranks() == list(range(8))
    assert mesh.flatten("r").sizes == {"r": 8}
    assert mesh.rename(hosts="dp").sizes == {"dp": 2, "gpus": 4}
    assert mesh.rename(hosts="gpus", gpus="hosts").sizes == {"gpus": 2, "hosts": 4}
    point = Point(6, mesh.extent)
    assert mesh.slice(**point)._shape.ranks() == [6]


def test_mesh_trait_errors() -> None:
    mesh = mesh24()
    for exc in (TypeError, ValueError, KeyError):  # upstream: TypeError; all three accepted
        with pytest.raises(exc, match="'procs'"):
            mesh.slice(procs=0)
    with pytest.raises(KeyError, match="'procs'"):
        mesh.size("procs")
    for index_exc in (IndexError, ValueError):
        with pytest.raises(index_exc, match="out of range"):
            mesh.slice(gpus=4)
        with pytest.raises(index_exc, match="out of range"):
            mesh.slice(gpus=-1)
        with pytest.raises(index_exc, match="out of range"):
            mesh.slice(gpus=slice(4, 8))
    with pytest.raises(ValueError, match="empty range"):
        mesh.slice(gpus=slice(2, 2))
    with pytest.raises(ValueError, match="negative step"):
        mesh.slice(gpus=slice(None, None, -1))
    with pytest.raises(ValueError, match="not evenly divided"):
        mesh.split(gpus=("dp", "tp"), tp=3)
    with pytest.raises(ValueError, match="Cannot infer"):
        mesh.split(gpus=("dp", "tp"))
    with pytest.raises(ValueError, match="unused size constraints"):
        mesh.split(gpus=("dp", "tp"), tp=2, pp=2)
    with pytest.raises(ValueError, match="not an existing dim"):
        mesh.split(procs=("a", "b"))
    with pytest.raises(ValueError, match="expected a sequence"):
        mesh.split(gpus="dp")
    with pytest.raises(ValueError, match="Duplicate"):
        mesh.rename(hosts="gpus")
    with pytest.raises(ValueError, match="sparse"):
        mesh.slice(gpus=slice(0, 4, 2)).flatten("r")
    with pytest.raises(TypeError):
        mesh.slice(gpus="0")  # type: ignore[arg-type]


def test_dimension_error_str_is_message() -> None:
    with pytest.raises(DimensionError) as info:
        mesh24().slice(procs=0)
    assert str(info.value).startswith("Shape does not have dimension labeled 'procs'")
    assert issubclass(MeshIndexError, IndexError) and issubclass(MeshIndexError, ValueError)


def test_region() -> None:
    r = Region(["a", "b"], NDSlice(3, [2, 2], [4, 1]))
    assert r.labels == ["a", "b"] and r.slice() == NDSlice(3, [2, 2], [4, 1])
    assert r.as_shape().ranks() == [3, 4, 7, 8] and r.point_of_base_rank(7) == Point(2, r.extent)
    assert pickle.loads(pickle.dumps(r)) == r
