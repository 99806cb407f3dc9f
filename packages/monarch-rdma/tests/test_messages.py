"""The owner's control messages: a msgspec tagged union served by monarch-core's one
``Service`` (``rdma``). Every request and answer round-trips; what the owner cannot read
(an unknown tag, a malformed field) is answered with a clear error, never silence; the
owner's refusals reach the asker as exceptions of the same kind."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, endpoint, this_host
from monarch.core import current_runtime
from monarch.core.lowlevel import ServiceError, ask
from monarch.rdma import RDMABuffer, RDMABufferDropped, RDMAError
from monarch.rdma._messages import (
    U64,
    Answer,
    Atomic,
    Connect,
    Connected,
    Copied,
    Drop,
    Dropped,
    Old,
    Pull,
    Pulled,
    Refused,
    Request,
    Stage,
)
from monarch.rdma._service import SERVICE, ask_owner

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")

u64 = st.integers(0, U64)
requests = st.one_of(
    st.builds(
        Pull,
        u64,
        st.floats(allow_nan=False),
        st.integers(1, 2**31),
        u64,
        u64,
        u64,
        u64,
    ),
    st.builds(Drop, u64),
    st.builds(Atomic, u64, st.sampled_from(["fetch_add", "compare_and_swap"]), u64, u64),
    st.builds(Connect, u64, st.integers(0, (1 << 24) - 1), st.text()),
    st.builds(Stage, u64, st.sampled_from(["out", "in"]), u64),
)
answers = st.one_of(
    st.builds(Pulled, st.booleans()),
    st.builds(Dropped, st.booleans()),
    st.builds(Old, u64),
    st.builds(Copied),
    st.builds(Connected, st.integers(0, (1 << 24) - 1), st.text()),
    st.builds(Refused, st.sampled_from(["dropped", "timeout", "transfer", "error"]), st.text()),
)


@given(requests)
def test_every_request_round_trips_through_the_services_decoder(request: Request) -> None:
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=SERVICE.requests) == request


@given(answers)
def test_every_answer_round_trips(answer: Answer) -> None:
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(answer), type=SERVICE.answers) == answer


class Stranger(msgspec.Struct, tag="stranger", array_like=True, frozen=True):
    """A request the rdma service does not know (a newer asker's, say)."""

    buffer_id: int


def test_an_unknown_or_malformed_request_gets_a_clear_error() -> None:
    here = current_runtime().address  # the client serves ``rdma`` too
    with pytest.raises(ServiceError, match=r"service 'rdma' cannot read the request"):
        ask(here, Stranger(1), timeout=30, service="rdma").get(timeout=60)
    with pytest.raises(ServiceError, match=r"cannot read the request.*>= 0"):
        ask(here, Drop(-1), timeout=30).get(timeout=60)
    with pytest.raises(ServiceError, match=r"cannot read the request.*>= 1"):
        ask(here, Pull(1, time.time() + 60, 0, 0, 0, 0, 8), timeout=30).get(timeout=60)
    with pytest.raises(ServiceError, match=r"cannot read the request"):
        ask(here, Atomic(1, "fetch_or", 1), timeout=30).get(timeout=60)  # type: ignore[arg-type]


class Holder(Actor):
    def __init__(self) -> None:
        self.data = bytearray(b"q" * 64)
        self.buf = RDMABuffer(self.data)

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buf


def test_the_owners_refusals_keep_their_kind() -> None:
    """Asked on a proc: a buffer it does not hold is dropped; a read-only one refuses an
    atomic; a pull past its expiry times out (never served late)."""
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="refusing")
    try:
        buf = procs.spawn("holder", Holder).handle.call_one().get(timeout=60)
        handle = buf._handle
        deadline = time.monotonic() + 30
        answer: Any = ask_owner(handle, Atomic(handle.buffer_id, "fetch_add", 5), deadline)
        assert answer == Old(int.from_bytes(b"q" * 8, "little"))
        with pytest.raises(RDMABufferDropped):
            ask_owner(handle, Atomic(handle.buffer_id + 1000, "fetch_add", 1), deadline)
        with pytest.raises(RDMAError, match="expired"):
            ask_owner(handle, Pull(handle.buffer_id, time.time() - 1, 1, 0, 0, 0, 8), deadline)
        with pytest.raises(RDMAError, match="not staged"):  # not a GPU's
            ask_owner(handle, Stage(handle.buffer_id, "out", 8), deadline)
        with pytest.raises(RDMAError, match="do not fit"):
            ask_owner(handle, Stage(handle.buffer_id, "in", 65), deadline)
        assert ask_owner(handle, Drop(handle.buffer_id), deadline) == Dropped(True)
        assert ask_owner(handle, Drop(handle.buffer_id), deadline) == Dropped(False)
        with pytest.raises(RDMABufferDropped):
            buf.write_from(b"x").get(timeout=60)
    finally:
        procs.stop().get(timeout=30)
