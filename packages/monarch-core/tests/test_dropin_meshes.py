"""Drop-in behaviour of mesh values (Selection, ValueMesh.from_indexed, Shape), as upstream's.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 to show the expectations are upstream's.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import monarch
from monarch.actor import ValueMesh

Selection: Any = monarch.Selection
Shape: Any = monarch.Shape
NDSlice: Any = monarch.NDSlice


def shape_2x2(offset: int = 0, strides: tuple[int, int] = (2, 1)) -> Any:
    return Shape(["a", "b"], NDSlice(offset=offset, sizes=[2, 2], strides=list(strides)))


# -- Selection ----------------------------------------------------------------------------------


def test_selection_all_and_any() -> None:
    assert repr(Selection.all()) == "All(True)"
    assert repr(Selection.any()) == "Any(True)"
    assert str(Selection.any()) == "Any(True)"


def r(start: int, end: int | None, step: int, inner: str) -> str:
    """Upstream's repr of a range selection."""
    return f"Range(Range({start}, {'None' if end is None else f'Some({end})'}, {step}), {inner})"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("*", "All(True)"),
        ("?", "Any(True)"),
        ("  *  ", "All(True)"),
        ("(*)", "All(True)"),
        ("0", r(0, 1, 1, "True")),
        ("01", r(1, 2, 1, "True")),
        ("1 2", r(12, 13, 1, "True")),  # whitespace is dropped first
        ("1:3", r(1, 3, 1, "True")),
        ("0:4:2", r(0, 4, 2, "True")),
        ("0:", r(0, None, 1, "True")),
        (":4", r(0, 4, 1, "True")),
        (":", r(0, None, 1, "True")),
        ("::2", r(0, None, 2, "True")),
        ("18446744073709551615", r(18446744073709551615, 0, 1, "True")),
        ("*, *, *", "All(All(All(True)))"),
        ("(*, 0:4, ?)", f"All({r(0, 4, 1, 'Any(True)')})"),
        (
            "0 | 1 & 2",
            f"Union({r(0, 1, 1, 'True')}, Intersection({r(1, 2, 1, 'True')}, "
            f"{r(2, 3, 1, 'True')}))",
        ),
        (
            "0|1|2",
            f"Union(Union({r(0, 1, 1, 'True')}, {r(1, 2, 1, 'True')}), {r(2, 3, 1, 'True')})",
        ),
        ("*, 0 | 1", f"Union(All({r(0, 1, 1, 'True')}), {r(1, 2, 1, 'True')})"),
        ("*, (0 | 1)", f"All(Union({r(0, 1, 1, 'True')}, {r(1, 2, 1, 'True')}))"),
        # a parenthesised selection hands what follows its comma to its innermost parts
        ("(0 | 1), *", f"Union({r(0, 1, 1, 'All(True)')}, {r(1, 2, 1, 'All(True)')})"),
        ("((0|1),*), ?", f"Union({r(0, 1, 1, 'All(Any(True))')}, {r(1, 2, 1, 'All(Any(True))')})"),
        (
            "(0,*)&(1,?), 2",
            f"Intersection({r(0, 1, 1, 'All(True)')}, "
            f"{r(1, 2, 1, 'Any(' + r(2, 3, 1, 'True') + ')')})",
        ),
    ],
)
def test_selection_from_string_parses_upstreams_syntax(text: str, parsed: str) -> None:
    assert repr(Selection.from_string(text)) == parsed


TOO_BIG = str(2**64)


def parse_error(rest: str, whole: str, code: str) -> str:
    return (
        f'parse error: Failed to parse selection: Error(Error {{ input: "{rest}", code: {code} }})'
        f' (input: "{whole}")'
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", parse_error("", "", "Tag")),
        ("all", parse_error("all", "all", "Tag")),
        ("-1", parse_error("-1", "-1", "Tag")),
        ("(*, 0:4", parse_error("(*,0:4", "(*,0:4", "Tag")),
        (TOO_BIG, parse_error(TOO_BIG, TOO_BIG, "Tag")),
        ("*,*,*,", parse_error(",", "*,*,*,", "Eof")),
        ("0:8:", parse_error(":", "0:8:", "Eof")),
        ("0..4", parse_error("..4", "0..4", "Eof")),
        ("*)", parse_error(")", "*)", "Eof")),
    ],
)
def test_selection_from_string_refuses_as_upstream(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="parse error") as info:
        Selection.from_string(text)
    assert str(info.value) == message


def test_selection_is_made_only_by_its_class_methods() -> None:
    with pytest.raises(TypeError):
        Selection()
    with pytest.raises(TypeError, match="'int' object cannot be cast as 'str'"):
        Selection.from_string(3)
    with pytest.raises(TypeError):
        pickle.dumps(Selection.all())


# -- ValueMesh.from_indexed ---------------------------------------------------------------------


def test_from_indexed_lays_values_out_by_rank_last_write_wins() -> None:
    mesh = ValueMesh.from_indexed(shape_2x2(), [(3, "z"), (1, "x"), (2, "y"), (0, "w"), (0, "W")])
    assert mesh.values() == ["W", "x", "y", "z"]
    assert mesh.item(a=1, b=0) == "y"
    assert [dict(point) for point, _ in mesh.items()] == [
        {"a": 0, "b": 0},
        {"a": 0, "b": 1},
        {"a": 1, "b": 0},
        {"a": 1, "b": 1},
    ]
    assert pickle.loads(pickle.dumps(mesh)).values() == ["W", "x", "y", "z"]


def test_from_indexed_ranks_count_from_zero_whatever_the_offset() -> None:
    mesh = ValueMesh.from_indexed(shape_2x2(offset=5, strides=(10, 1)), [(i, i) for i in range(4)])
    assert mesh.values() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="expected 4 ranks, but contains 6 ranks"):
        ValueMesh.from_indexed(shape_2x2(offset=5, strides=(10, 1)), [(5, 0), (6, 1)])


@pytest.mark.parametrize(
    ("ranks", "contains"),
    [
        ([0, 1, 2], 3),  # one missing
        ([0, 0, 0, 0], 1),
        ([], 0),
        ([0, 1, 2, 4], 5),  # out of range: the first such rank counts
        ([7, 100], 8),
        ([0, 1, 2, 3, 4, 5], 5),
    ],
)
def test_from_indexed_needs_every_rank(ranks: list[int], contains: int) -> None:
    with pytest.raises(ValueError, match="invalid value mesh") as info:
        ValueMesh.from_indexed(shape_2x2(), [(rank, rank) for rank in ranks])
    assert str(info.value) == f"invalid value mesh: expected 4 ranks, but contains {contains} ranks"


PAIRS = "argument 'pairs': "


@pytest.mark.parametrize(
    ("pairs", "error", "message"),
    [
        ([(-1, 0)], OverflowError, "can't convert negative int to unsigned"),
        ([("0", 0)], TypeError, f"{PAIRS}'str' object cannot be interpreted as an integer"),
        ([(0.0, 0)], TypeError, f"{PAIRS}'float' object cannot be interpreted as an integer"),
        ([0], TypeError, f"{PAIRS}'int' object cannot be cast as 'tuple'"),
        ([(0, 1, 2)], ValueError, "expected tuple of length 2, but got tuple of length 3"),
        (iter([(0, 0)]), TypeError, f"{PAIRS}'list_iterator' object cannot be cast as 'Sequence'"),
    ],
)
def test_from_indexed_refuses_bad_pairs(pairs: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        ValueMesh.from_indexed(shape_2x2(), pairs)
    assert str(info.value) == message


def test_from_indexed_takes_bools_as_ranks_and_wants_a_shape() -> None:
    pairs = [(False, 0), (True, 1), (2, 2), (3, 3)]
    assert ValueMesh.from_indexed(shape_2x2(), pairs).values() == [0, 1, 2, 3]
    with pytest.raises(TypeError, match="argument 'shape': 'str' object cannot be cast as 'Shape'"):
        ValueMesh.from_indexed("x", [(0, 0)])  # type: ignore[arg-type]


# -- Shape ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["a", "b", "no such dimension"])
def test_shape_at_negative_index_is_an_overflow(label: str) -> None:
    shape = Shape(["a", "b"], NDSlice(offset=0, sizes=[2, 3], strides=[3, 1]))
    with pytest.raises(OverflowError, match="can't convert negative int to unsigned"):
        shape.at(label, -1)


def test_shape_at_a_bool_is_an_index() -> None:
    shape = Shape(["a", "b"], NDSlice(offset=0, sizes=[2, 3], strides=[3, 1]))
    assert shape.at("a", True).ndslice.offset == 3
