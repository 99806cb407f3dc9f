"""Pickling of user values: round trips, out-of-band buffers, __main__-style classes."""

from __future__ import annotations

import pickle
from typing import Any, ClassVar

from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, endpoint, this_host, this_proc
from monarch.core import calling_endpoint
from monarch.core._payload._serialize import (
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


class _Batch:
    """A user's object holding bytes in an attribute, where the lift of containers never looks."""

    def __init__(self, step: int, data: bytes, more: object = None) -> None:
        self.step, self.data, self.more = step, data, more

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Batch) and vars(self) == vars(other)


LARGE_WRITE = 64 * 1024
"""From here CPython's pickler hands a bytes payload to its file whole."""


def test_bytes_in_an_attribute_travel_as_a_part_of_their_own() -> None:
    """The pickle is written into a WriteBuffer, which keeps the large payload the pickler
    hands it: the message carries that very object, never copied into the pickle."""
    blob = bytes(range(256)) * (LARGE_WRITE // 256 * 4)
    parts = dumps(_Batch(3, blob))
    assert any(part is blob for part in parts)
    assert sum(memoryview(part).nbytes for part in parts) < len(blob) + 4096
    restored = loads(parts)
    assert restored == _Batch(3, blob) and type(restored.data) is bytes
    # as read from a socket: memoryviews of other buffers
    assert loads([memoryview(bytearray(part)) for part in parts]) == _Batch(3, blob)


@given(
    st.lists(st.integers(0, 3 * LARGE_WRITE), min_size=1, max_size=4),
    st.integers(0, 2 * OUT_OF_BAND_MIN),
)
def test_streams_in_parts_round_trip(sizes: list[int], out_of_band: int) -> None:
    """Any mix of payloads written whole, frames between them and out-of-band buffers."""
    batches = [_Batch(i, bytes([i]) * size) for i, size in enumerate(sizes)]
    value = (batches, bytearray(b"\x05" * out_of_band), "tail")
    assert loads(dumps(value)) == value
    args, kwargs = loads_arguments(dumps_arguments((value,), {"k": batches}))
    assert args == (value,) and kwargs == {"k": batches}


def test_bytes_in_an_attribute_reach_an_actor_and_come_back() -> None:
    blob = b"\x01" * (2 * LARGE_WRITE) + b"\x02" * (3 << 20)  # lent within the host, too
    procs = this_host().spawn_procs(per_host={"x": 1})
    try:
        actor = procs.spawn("stream_echo", _Echo)
        value = _Batch(1, blob, more=[_Batch(2, blob[:100])])
        assert actor.echo.call_one(value).get(timeout=60) == value
    finally:
        procs.stop().get(timeout=60)
