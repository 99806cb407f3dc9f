"""``Admission``'s invariants: it never keeps more than the cap, and past the cap it evicts
the oldest handshake of the most crowded source (so a source never evicts a less crowded
one's)."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.transport._admission import Admission

step = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from("abc")),
    st.tuples(st.just("release"), st.integers(0, 50)),
)


@pytest.mark.anyio
@given(cap=st.integers(1, 6), steps=st.lists(step, max_size=60))
async def test_admission_keeps_at_most_the_cap_and_evicts_the_crowded_sources_oldest(
    cap: int, steps: list[tuple[str, object]]
) -> None:
    """(In an event loop: a cancel scope belongs to one.)"""
    admission = Admission(cap, "test")
    live: list[tuple[str, anyio.CancelScope]] = []  # (source, scope), oldest first: the model
    for kind, arg in steps:
        if kind == "admit":
            assert isinstance(arg, str)
            evicted = None
            if len(live) == cap:
                counts = {s: sum(1 for src, _ in live if src == s) for s, _ in live}
                crowded = max(counts.values())
                candidates = [(s, sc) for s, sc in live if counts[s] == crowded]
                evicted = candidates  # the oldest of one of the most crowded sources
            scope = anyio.CancelScope()
            admission.admit(arg, scope)
            if evicted is not None:
                gone = [(s, sc) for s, sc in live if sc.cancel_called]
                assert len(gone) == 1
                source = gone[0][0]
                assert gone[0] == next(e for e in evicted if e[0] == source)
                live.remove(gone[0])
            assert not scope.cancel_called
            live.append((arg, scope))
        elif live:
            assert isinstance(arg, int)
            source, scope = live.pop(arg % len(live))
            admission.release(scope)
            admission.release(scope)  # twice: the same
        assert len(live) <= cap
    assert not any(sc.cancel_called for _, sc in live)
