"""Pickling of user values: round trips, out-of-band buffers, __main__-style classes."""

from __future__ import annotations

import pickle
from typing import Any, ClassVar

from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, endpoint, this_proc
from monarch.core import calling_endpoint
from monarch.core._serialize import (
    OUT_OF_BAND_MIN,
    dumps,
    dumps_arguments,
    loads,
    loads_arguments,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=64),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=5),
    ),
    max_leaves=20,
)


@given(values)
def test_round_trip(value: Any) -> None:
    assert loads(dumps(value)) == value


@given(st.lists(values, max_size=4).map(tuple), st.dictionaries(st.text(max_size=5), values))
def test_arguments_round_trip(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """No arguments at all take a shortcut both ways; the kwargs are a fresh dict each time."""
    first = loads_arguments(dumps_arguments(args, kwargs))
    assert first == (args, kwargs)
    first[1]["mutated"] = True
    assert loads_arguments(dumps_arguments(args, kwargs)) == (args, kwargs)
    # memoryview parts, as read from a socket, are understood too
    parts = [memoryview(bytes(p)) for p in dumps_arguments(args, kwargs)]
    assert loads_arguments(parts) == (args, kwargs)


@given(st.integers(OUT_OF_BAND_MIN, 3 * OUT_OF_BAND_MIN), st.sampled_from([bytes, bytearray]))
def test_large_buffers_travel_out_of_band(size: int, kind: type) -> None:
    buffer = kind(b"\x07" * size)
    parts = dumps(((buffer, "x"), {"again": buffer}))
    assert len(parts) == 3 and all(memoryview(p).nbytes == size for p in parts[1:])
    (args, kwargs) = loads(parts)
    assert args[0] == buffer and type(args[0]) is kind and kwargs["again"] == buffer


def test_locally_defined_classes_travel_by_value() -> None:
    class Local:
        def __init__(self, x: int) -> None:
            self.x = x

    restored = loads(dumps(Local(3)))
    assert restored.x == 3
    # Plain pickle could not have sent it:
    try:
        pickle.dumps(Local(3))
    except (pickle.PicklingError, AttributeError):
        pass
    else:  # pragma: no cover - would mean the test proves nothing
        raise AssertionError("plain pickle handled a local class")


class _Probe:
    """Records, when pickled, which endpoint's call arguments are being pickled."""

    seen: ClassVar[list[str | None]] = []

    def __reduce__(self) -> tuple[type[int], tuple[int]]:
        _Probe.seen.append(calling_endpoint())
        return (int, (0,))


class _Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x


def test_a_sibling_wheel_can_tell_call_arguments_from_other_pickles() -> None:
    """monarch-tensor pickles its Tensor as a reference only inside an endpoint's call."""
    _Probe.seen.clear()
    pickle.dumps(_Probe())
    actor = this_proc().spawn("probe_echo", _Echo)
    assert actor.echo.call_one([_Probe()]).get(timeout=30) == [0]
    pickle.dumps(_Probe())
    assert _Probe.seen == [None, "echo", None]
