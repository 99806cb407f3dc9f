"""ValueMesh: layout, MeshTrait ops, RLE dedup and lazy unpickling."""

from __future__ import annotations

import itertools
import pickle
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core._layout._shape import Extent, NDSlice, Point, Shape
from monarch.core._layout._value_mesh import ValueMesh

FAST = settings(max_examples=60, deadline=None)


@st.composite
def shapes(draw: st.DrawFn, max_dims: int = 3, max_size: int = 4) -> Shape:
    """Shapes of strided slices (as produced by slicing a bigger mesh)."""
    if draw(st.integers(0, 4)) == 0:  # stepped, interleaved: ranks 0, 2, 3, 5 (+ offset)
        base = Shape(["d0", "d1"], NDSlice(draw(st.integers(0, 5)), [2, 3], [3, 1]))
        return base.select("d1", slice(0, None, 2))
    ndim = draw(st.integers(0, max_dims))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=ndim, max_size=ndim))
    strides = [0] * ndim
    run = 1
    for dim in draw(st.permutations(range(ndim))):
        strides[dim] = run * draw(st.integers(1, 2))
        run = strides[dim] * sizes[dim]
    return Shape([f"d{i}" for i in range(ndim)], NDSlice(draw(st.integers(0, 5)), sizes, strides))


def counting_loads() -> tuple[Callable[[Any], Any], Counter[bytes]]:
    calls: Counter[bytes] = Counter()

    def loads(payload: Any) -> Any:
        calls[bytes(payload)] += 1
        return pickle.loads(payload)

    return loads, calls


def shape2x3() -> Shape:
    return Shape(["x", "y"], NDSlice(offset=0, sizes=[2, 3], strides=[3, 1]))


# -- upstream's examples ---------------------------------------------------------------------


def test_construction_and_access() -> None:
    vm = ValueMesh(shape2x3(), ["00", "01", "02", "10", "11", "12"])
    assert len(vm) == 6
    assert vm.values() == ["00", "01", "02", "10", "11", "12"]
    assert vm.item(x=0, y=0) == "00" and vm.item(x=0, y=2) == "02" and vm.item(x=1, y=1) == "11"
    assert vm.slice(x=1, y=2).item() == "12"
    assert vm.get(4) == "11"
    items = list(vm.items())
    assert items[0] == (Point(0, vm.extent), "00") and [v for _, v in vm] == vm.values()
    with pytest.raises(ValueError, match="expected 6 values"):
        ValueMesh(shape2x3(), [1, 2])


def test_repr_matches_upstream() -> None:
    shape = Shape(["x", "y", "z"], NDSlice(offset=0, sizes=[2, 2, 2], strides=[4, 2, 1]))
    vm = ValueMesh(shape, ["000", "001", "010", "011", "100", "101", "110", "111"])
    assert (
        repr(vm)
        == """\
ValueMesh({x: 2, y: 2, z: 2}):
(
  ({'x': 0/2, 'y': 0/2, 'z': 0/2}, '000'),
  ({'x': 0/2, 'y': 0/2, 'z': 1/2}, '001'),
  ({'x': 0/2, 'y': 1/2, 'z': 0/2}, '010'),
  ({'x': 0/2, 'y': 1/2, 'z': 1/2}, '011'),
  ({'x': 1/2, 'y': 0/2, 'z': 0/2}, '100'),
  ({'x': 1/2, 'y': 0/2, 'z': 1/2}, '101'),
  ({'x': 1/2, 'y': 1/2, 'z': 0/2}, '110'),
  ({'x': 1/2, 'y': 1/2, 'z': 1/2}, '111'),
)"""
    )


def test_mesh_trait_ops() -> None:
    vm = ValueMesh(shape2x3(), list(range(6)))
    assert vm.shape.labels == ["x", "y"] and vm.extent["x"] == 2 and vm.extent["y"] == 3
    assert vm.sizes == {"x": 2, "y": 3} and vm.size() == 6 and vm.size("x") == 2
    assert vm.slice(x=1).values() == [3, 4, 5] and vm.slice(x=1).sizes == {"y": 3}
    flat = vm.flatten("rank")
    assert flat.shape.labels == ["rank"] and flat.values() == list(range(6))
    renamed = vm.rename(x="rows", y="cols")
    assert renamed.shape.labels == ["rows", "cols"] and renamed.values() == list(range(6))
    split = ValueMesh(Shape(["rank"], NDSlice(0, [6], [1])), list(range(6))).split(
        rank=("x", "y"), y=3
    )
    assert split.sizes == {"x": 2, "y": 3} and split.values() == list(range(6))
    assert vm.slice(y=slice(0, 3, 2)).values() == [0, 2, 3, 5]
    assert vm._new_with_shape(vm._shape).values() == list(range(6))
    for point, value in vm.flatten("rank").items():
        assert point.rank == value


def test_errors() -> None:
    vm = ValueMesh(shape2x3(), list(range(6)))
    with pytest.raises(TypeError, match="not subscriptable"):
        vm[0]  # type: ignore[index]
    with pytest.raises(KeyError, match="y"):
        vm.item(x=0)
    with pytest.raises(KeyError, match="extra"):
        vm.item(x=0, y=0, z=0)
    with pytest.raises(KeyError):
        vm.item()
    with pytest.raises(IndexError):
        vm.item(x=2, y=0)
    for exc in (IndexError, ValueError):
        with pytest.raises(exc, match="out of range"):
            vm.get(6)
        with pytest.raises(exc, match="out of range"):
            vm.get(-1)
    with pytest.raises(AttributeError):
        vm.anything = 1  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="not a subset"):
        vm._new_with_shape(Shape(["r"], NDSlice(100, [1], [1])))


def test_equality_and_pickle() -> None:
    vm = ValueMesh(shape2x3(), ["a", "b", "c", "d", "e", "f"])
    copy = pickle.loads(pickle.dumps(vm))
    assert type(copy) is ValueMesh and copy == vm and copy.values() == vm.values()
    assert copy.item(x=1, y=2) == "f" and copy.sizes == {"x": 2, "y": 3}
    assert vm != ValueMesh(shape2x3(), ["a", "b", "c", "d", "e", "g"])
    sliced = vm.slice(x=1)
    assert pickle.loads(pickle.dumps(sliced)) == sliced
    with pytest.raises(TypeError):
        hash(vm)


def test_exception_values_are_returned_not_raised() -> None:
    error = RuntimeError("rank 1 failed")
    vm = ValueMesh(Shape(["r"], NDSlice(0, [2], [1])), [1, error])
    assert vm.get(1) is error and vm.values() == [1, error]
    lazy = ValueMesh._from_pickled(vm.shape, [pickle.dumps(1), pickle.dumps(error)])
    assert isinstance(lazy.get(1), RuntimeError)


# -- properties ------------------------------------------------------------------------------


@FAST
@given(shapes(), st.data())
def test_items_are_row_major(shape: Shape, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.integers(), min_size=len(shape), max_size=len(shape)))
    vm = ValueMesh(shape, values)
    items = vm.items()
    assert [v for _, v in items] == values == vm.values() == [v for _, v in vm]
    for i, (point, value) in enumerate(items):
        assert point == Point(i, Extent(shape.labels, shape.ndslice.sizes))
        assert vm.item(**point) == value == vm.get(i)
        assert shape.rank_of(dict(point)) == shape.ndslice[i]


@FAST
@given(shapes(), st.data())
def test_dedup_keeps_values(shape: Shape, data: st.DataObject) -> None:
    pool = [object(), "a", ("t", 1), None]
    picks = data.draw(
        st.lists(st.sampled_from(range(len(pool))), min_size=len(shape), max_size=len(shape))
    )
    values = [pool[i] for i in picks]
    vm = ValueMesh(shape, values)
    assert all(a is b for a, b in zip(vm.values(), values, strict=True))
    assert len(vm._table._entries) == len(set(picks))
    assert len(vm._run_starts) == 1 + sum(a != b for a, b in itertools.pairwise(picks))
    lazy = ValueMesh._from_pickled(shape, [pickle.dumps(p * 10) for p in picks])
    assert lazy.values() == [p * 10 for p in picks]
    assert len(lazy._table._entries) == len(set(picks))


@FAST
@given(shapes(), st.data())
def test_lazy_unpickles_each_unique_payload_at_most_once(shape: Shape, data: st.DataObject) -> None:
    picks = data.draw(st.lists(st.integers(0, 3), min_size=len(shape), max_size=len(shape)))
    payloads: list[bytes | memoryview] = [
        memoryview(pickle.dumps({"v": p})) if i % 2 else pickle.dumps({"v": p})
        for i, p in enumerate(picks)
    ]
    loads, calls = counting_loads()
    vm = ValueMesh._from_pickled(shape, payloads, loads=loads)
    assert not calls  # nothing unpickled until read
    if shape.labels:
        label = data.draw(st.sampled_from(shape.labels))
        part = vm.slice(**{label: slice(None, None, 2)})
        part.values()
        assert all(n == 1 for n in calls.values())
    for _ in range(2):
        assert vm.values() == [{"v": p} for p in picks]
        assert [v for _, v in vm.items()] == vm.values()
        if vm.shape.ndslice.is_contiguous():
            assert vm.flatten("r").values() == vm.values()
    assert set(calls) == {pickle.dumps({"v": p}) for p in picks}
    assert all(n == 1 for n in calls.values())
    assert pickle.loads(pickle.dumps(vm)) == vm  # pickling materializes, loads still once
    assert all(n == 1 for n in calls.values())


@FAST
@given(shapes(), st.data())
def test_slicing_value_mesh_matches_shape(shape: Shape, data: st.DataObject) -> None:
    vm = ValueMesh(shape, list(shape.ranks()))  # value = global rank
    if not shape.labels:
        assert vm.item() == shape.ranks()[0]
        return
    label = data.draw(st.sampled_from(shape.labels))
    size = shape.extent[label]
    start = data.draw(st.integers(0, size - 1))
    options: list[int | slice] = [start, slice(start, None, 2)]
    sel = data.draw(st.sampled_from(options))
    sliced = vm.slice(**{label: sel})
    assert sliced.values() == sliced.shape.ranks() == shape.slice(**{label: sel}).ranks()


def test_identical_replies_stored_once() -> None:
    shape = Shape(["hosts", "gpus"], NDSlice.new_row_major([16, 64]))
    payload = pickle.dumps({"config": list(range(10))})
    loads, calls = counting_loads()
    vm = ValueMesh._from_pickled(shape, [payload] * len(shape), loads=loads)
    assert len(vm._table._entries) == 1 and len(vm._run_starts) == 1
    assert vm.item(hosts=3, gpus=7) == {"config": list(range(10))}
    assert vm.slice(hosts=slice(2, 9)).values()[0] is vm.get(0)
    assert calls[payload] == 1


def test_loads_failure_propagates_and_is_retried() -> None:
    attempts = []

    def flaky(payload: Any) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise ImportError("module not importable yet")
        return pickle.loads(payload)

    vm = ValueMesh._from_pickled(Shape(["r"], NDSlice(0, [3], [1])), [pickle.dumps(7)] * 3, flaky)
    with pytest.raises(ImportError):
        vm.get(0)
    assert vm.values() == [7, 7, 7] and len(attempts) == 2


def test_concurrent_first_access_unpickles_once() -> None:
    loads, calls = counting_loads()
    barrier = threading.Barrier(8)
    vm = ValueMesh._from_pickled(Shape(["r"], NDSlice(0, [8], [1])), [pickle.dumps("x")] * 8, loads)

    def read(i: int) -> None:
        barrier.wait()
        assert vm.get(i) == "x"

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(calls.values()) == 1
