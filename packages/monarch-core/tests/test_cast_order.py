"""Sequence numbers of casts (``_cast``): taken per destination, put back in order."""

from __future__ import annotations

import threading
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from monarch.core._runtime._cast import ReceiveOrder, SendOrder


def test_each_destination_numbers_its_casts_from_one() -> None:
    order = SendOrder()
    assert order.take("m", ["a", "b"]) == (1, 1)
    assert order.take("m", ["b"]) == (2,)
    assert order.take("m", ["a", "b", "c"]) == (2, 3, 1)
    assert order.take("other", ["a"]) == (1,)


def test_threads_taking_at_once_never_share_a_number() -> None:
    order, taken = SendOrder(), list[int]()

    def take() -> None:
        taken.extend(order.take("m", ["a"])[0] for _ in range(2000))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == list(range(1, 8001))


class Clock:
    """``call_later`` for ReceiveOrder: timers fire when the test says time has passed."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Any, tuple[Any, ...]]] = []

    def call_later(self, delay: float, fn: Any, *args: Any) -> None:
        self.timers.append((delay, fn, args))

    def expire(self) -> None:
        timers, self.timers = self.timers, []
        for _, fn, args in timers:
            fn(*args)


arrivals = st.dictionaries(st.sampled_from("xyz"), st.integers(1, 30)).flatmap(
    lambda counts: st.permutations([(o, s) for o, n in counts.items() for s in range(1, n + 1)])
)


@given(arrivals, st.lists(st.booleans()))
def test_messages_are_delivered_in_sequence_order_per_origin(
    arrived: list[tuple[str, int]], fast: list[bool]
) -> None:
    """Whether each arrival goes through ``is_next`` first (as _LocalMesh does) or
    straight to ``accept``, the order is the same."""
    delivered: list[tuple[str, int]] = []
    clock = Clock()
    order = ReceiveOrder(delivered.append, clock.call_later, lambda: 5.0)
    for i, (origin, seq) in enumerate(arrived):
        if i < len(fast) and fast[i] and order.is_next(origin, seq):
            delivered.append((origin, seq))
        else:
            order.accept(origin, seq, (origin, seq))
    for origin in "xyz":
        mine = [seq for o, seq in delivered if o == origin]
        assert mine == list(range(1, len(mine) + 1))
    assert sorted(delivered) == sorted(arrived)  # nothing lost, nothing twice
    assert all(delay == 5.0 for delay, _, _ in clock.timers)


@given(arrivals, st.data())
def test_a_gap_that_never_fills_is_skipped_once_its_time_is_up(
    arrived: list[tuple[str, int]], data: st.DataObject
) -> None:
    if not arrived:
        return
    lost = data.draw(st.sampled_from(arrived))
    delivered: list[tuple[str, int]] = []
    clock = Clock()
    order = ReceiveOrder(delivered.append, clock.call_later, lambda: 5.0)
    for origin, seq in arrived:
        if (origin, seq) != lost:
            order.accept(origin, seq, (origin, seq))
    clock.expire()
    assert sorted(delivered) == sorted(a for a in arrived if a != lost)
    skipped = any(o == lost[0] and seq > lost[1] for o, seq in arrived)
    order.accept(*lost, lost)
    # Late: dropped if later ones went on without it, else simply next in order.
    assert (lost in delivered) is not skipped
