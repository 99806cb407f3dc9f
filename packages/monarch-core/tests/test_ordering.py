"""FIFO per sender under random interleavings of adverbs and senders (hypothesis)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monarch.actor import Actor, Channel, ProcMesh, endpoint, send, this_host
from monarch.config import configured
from monarch.core import current_runtime


class Log(Actor):
    def __init__(self) -> None:
        self.entries: list[tuple[str, int]] = []

    @endpoint
    def add(self, sender: str, seq: int) -> None:
        self.entries.append((sender, seq))

    @endpoint
    def take(self) -> list[tuple[str, int]]:
        entries, self.entries = self.entries, []
        return entries


class Sender(Actor):
    @endpoint
    def burst(self, target: Any, name: str, adverbs: list[str]) -> None:
        for seq, adverb in enumerate(adverbs):
            _issue(target, adverb, name, seq)


def _issue(target: Any, adverb: str, name: str, seq: int) -> None:
    if adverb == "call":
        target.add.call(name, seq)
    elif adverb == "broadcast":
        target.add.broadcast(name, seq)
    else:
        port, _ = Channel[None].open()
        send(target.add, (name, seq), {}, port=port)


@pytest.fixture(scope="module", params=[(5, 1), (10, 4)], ids=["5-procs", "10-procs-in-3"])
def procs(request: pytest.FixtureRequest) -> Iterator[ProcMesh]:
    """A fan-out of 2, so casts to all procs go through relays: five procs, or ten of them
    sharing three processes (whose actors are then reached by one message per process)."""
    size, together = request.param
    with configured(max_cast_fanout=2, procs_per_process=together):
        mesh = this_host().spawn_procs(per_host={"gpus": size})
        yield mesh
        mesh.stop().get(timeout=30)


def test_a_cast_is_relayed_down_a_tree(procs: ProcMesh) -> None:
    logs = procs.spawn("tree", Log)
    logs.take.call().get(timeout=30)  # procs and actors are up
    runtime = current_runtime()
    before = runtime.posted
    logs.add.broadcast("client", 1)
    sent = _wait_posted(runtime, before)
    assert sent == 2  # one message per chunk head, not one per actor
    assert logs.take.call().get(timeout=30).values() == [[("client", 1)]] * procs.size()


def _wait_posted(runtime: Any, before: int) -> int:
    # broadcast() hands the cast to the runtime loop; a round trip through the loop
    # (an empty future resolved there) guarantees the cast has been posted.
    from monarch.core import run_on

    async def nothing() -> None:
        return None

    run_on(runtime, nothing()).get(timeout=10)
    return int(runtime.posted - before)


def test_fifo_holds_when_casts_take_different_paths(procs: ProcMesh) -> None:
    logs = procs.spawn("paths", Log)
    last = procs.size() - 1
    for seq in range(1, 41):
        if seq % 2:
            logs.add.broadcast("client", seq)  # relayed to the last proc
        else:
            logs.slice(gpus=last).add.broadcast("client", seq)  # sent to it directly
    entries = logs.slice(gpus=last).take.call_one().get(timeout=30)
    assert [seq for _, seq in entries] == list(range(1, 41))


adverbs = st.lists(st.sampled_from(["call", "broadcast", "send"]), min_size=1, max_size=25)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(client=adverbs, senders=st.lists(adverbs, min_size=0, max_size=2))
def test_each_senders_messages_arrive_in_order(
    procs: ProcMesh, client: list[str], senders: list[list[str]]
) -> None:
    logs = procs.spawn("log", Log)
    bursts = []
    for i, plan in enumerate(senders):
        sender = procs.slice(gpus=i % procs.size()).spawn(f"sender{i}", Sender)
        bursts.append(sender.burst.call_one(logs, f"actor{i}", plan))
    for seq, adverb in enumerate(client):
        _issue(logs, adverb, "client", seq)
    for burst in bursts:
        burst.get(timeout=30)
    # A last call from each sender proves everything it sent before has been handled.
    expected = {"client": list(range(len(client)))}
    expected.update({f"actor{i}": list(range(len(plan))) for i, plan in enumerate(senders)})
    seen = logs.take.call().get(timeout=30).values()
    for entries in seen:
        by_sender: dict[str, list[int]] = {}
        for name, seq in entries:
            by_sender.setdefault(name, []).append(seq)
        assert by_sender["client"] == expected["client"]
        for name, seqs in by_sender.items():
            # Actor senders' messages may still be in flight, but never out of order.
            assert seqs == expected[name][: len(seqs)]
    logs.stop().get(timeout=30)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=st.lists(st.tuples(adverbs, st.booleans()), min_size=1, max_size=4))
def test_fifo_holds_through_sends_together(
    procs: ProcMesh, plan: list[tuple[list[str], bool]]
) -> None:
    """Casts held by ``sends_together`` (some blocks nested) leave as the block ends, in
    the order they were made, with those made outside the blocks."""
    from monarch.core.lowlevel import sends_together

    logs = procs.spawn("together", Log)
    seq = 0
    for adverbs_of_block, nested in plan:
        with sends_together():
            for adverb in adverbs_of_block:
                if nested:
                    with sends_together():
                        _issue(logs, adverb, "client", seq)
                else:
                    _issue(logs, adverb, "client", seq)
                seq += 1
        _issue(logs, "broadcast", "client", seq)  # one outside any block
        seq += 1
    for entries in logs.take.call().get(timeout=30).values():
        assert [s for _, s in entries] == list(range(seq))
    logs.stop().get(timeout=30)


def test_a_call_made_in_sends_together_leaves_as_the_block_ends(procs: ProcMesh) -> None:
    from monarch.core.lowlevel import sends_together

    logs = procs.spawn("held", Log)
    logs.take.call().get(timeout=30)  # its actors are up
    with sends_together():
        held = logs.take.call()
        with pytest.raises(TimeoutError):
            held.get(timeout=0.3)  # not sent yet: no answer can come
    assert list(held.get(timeout=30).values()) == [[]] * procs.size()
    logs.stop().get(timeout=30)
