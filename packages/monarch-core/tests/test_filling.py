"""A large tensor in a call is copied while it travels (``_filling``): whatever the reader
does (takes it all from the ring, stops early, starts late, is frozen), what arrives is the
tensor as it was at the call, and the caller may change it as soon as the call returns."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from monarch.actor import Actor, ProcMesh, endpoint, this_host  # noqa: E402
from monarch.core._bulk._lending import _FILLING, pull  # noqa: E402
from monarch.core._payload import _memory as memory  # noqa: E402
from monarch.core._payload._filling import DEFER_MIN, MARKER_SIZE, new_filling  # noqa: E402

MIB = 1 << 20


class Reader(Actor):
    def __init__(self) -> None:
        self.kept: Any = None

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def checksum(self, tensor: Any) -> tuple[float, list[int], list[int]]:
        return float(tensor.double().sum()), list(tensor.shape), list(tensor.stride())

    @endpoint
    def keep(self, size: int) -> Any:
        """Returns its tensor, which its next call changes in place."""
        self.kept = torch.arange(size, dtype=torch.float32)
        return self.kept

    @endpoint
    def change(self) -> None:
        self.kept.fill_(-1)


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    yield mesh
    mesh.stop().get(timeout=30)


@pytest.fixture(scope="module")
def reader(procs: ProcMesh) -> Any:
    return procs.spawn("reader", Reader)


def _expected(tensor: Any) -> float:
    return float(tensor.double().sum())


def test_a_tensor_changed_as_soon_as_the_call_returns_arrives_as_it_was(reader: Any) -> None:
    tensor = torch.arange(16 * MIB // 4, dtype=torch.float32)
    expected = _expected(tensor)
    for _ in range(5):  # the reader takes it from the ring as the call returns
        arrived = reader.checksum.call_one(tensor)
        tensor.fill_(7)
        assert arrived.get(timeout=60)[0] == expected
        tensor.copy_(torch.arange(16 * MIB // 4, dtype=torch.float32))


def test_a_frozen_reader_gets_the_copy_made_for_it(reader: Any) -> None:
    """A reader that does not start in time: the caller copies the whole tensor before
    the call returns, and the reader, once it goes on, reads that copy."""
    pid = reader.pid.call_one().get(timeout=60)
    tensor = torch.arange(32 * MIB // 4, dtype=torch.float32)
    expected = _expected(tensor)
    os.kill(pid, signal.SIGSTOP)
    try:
        arrived = reader.checksum.call_one(tensor)
        tensor.fill_(7)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert arrived.get(timeout=60)[0] == expected


def test_a_returned_tensor_changed_by_the_next_call_arrived_as_it_was(reader: Any) -> None:
    size = 16 * MIB // 4
    got = reader.keep.call_one(size)
    reader.change.call_one().get(timeout=60)
    assert float(got.get(timeout=60).double().sum()) == float(size * (size - 1) / 2)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    mib=st.sampled_from([DEFER_MIN // MIB - 1, DEFER_MIN // MIB, 5, 9]),
    extra=st.integers(0, 4095),
    layout=st.sampled_from(["contiguous", "transposed", "strided"]),
    dtype=st.sampled_from([torch.float32, torch.int16, torch.float64]),
)
def test_any_size_and_layout_arrives_as_it_was_at_the_call(
    reader: Any, mib: int, extra: int, layout: str, dtype: Any
) -> None:
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = (mib * MIB + extra) // itemsize
    base = torch.arange(count * 2, dtype=dtype)
    if layout == "contiguous":
        tensor = base[:count]
    elif layout == "transposed":  # dense, not contiguous: its strides travel as they are
        rows = count // 64
        tensor = base[: rows * 64].view(64, rows).t()
    else:  # not dense: copied into a contiguous one at the call
        tensor = base[::2]
    expected = (_expected(tensor), list(tensor.shape))
    arrived = reader.checksum.call_one(tensor)
    base.fill_(3)
    checksum, shape, _ = arrived.get(timeout=60)
    assert (checksum, shape) == expected


def test_a_reader_that_stopped_taking_waits_for_the_copy() -> None:
    """The borrower's side alone: it reads the snapshot only once its marker is set."""
    size = 8 * MIB
    source = bytearray(os.urandom(MIB)) * 8
    snapshot = memory.fresh_bytearray(size + MARKER_SIZE)
    snapshot[:size] = b"\xaa" * size  # what a reader that did not wait would get
    address = memory.address_of(snapshot)
    filling = new_filling(snapshot, address, source, memory.address_of(source))
    got: list[bytes | bytearray] = []
    borrower = threading.Thread(
        target=lambda: got.append(pull(os.getpid(), address, size, _FILLING))
    )
    borrower.start()
    deadline = time.monotonic() + 30
    while not _waiting_in(borrower, "_await_filled"):
        assert time.monotonic() < deadline, "the borrower never waited for the marker"
        time.sleep(0.001)
    filling.fill()
    borrower.join(30)
    assert got and got[0] == source


def _waiting_in(thread: threading.Thread, function: str) -> bool:
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False
