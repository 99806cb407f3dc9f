"""Properties: chunking and striping reassemble any byte range exactly; the batch's race
check accepts exactly the race-free batches."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core.lowlevel import Executor
from monarch.rdma import RDMAAction, RDMABuffer
from monarch.rdma import _tcp as tcp
from monarch.rdma._chunks import plan
from monarch.rdma._overlap import Access, first_race
from monarch.rdma._region import Region, region_of

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")


@given(
    size=st.integers(0, 1 << 30),
    streams=st.integers(1, 16),
    data=st.data(),
    min_stripe=st.integers(1, 1 << 20),
)
def test_chunks_cover_the_range_exactly(
    size: int, streams: int, data: st.DataObject, min_stripe: int
) -> None:
    max_chunk = data.draw(st.integers(max(1, size >> 12), 1 << 26))  # at most 4096 chunks
    chunks = plan(size, streams, max_chunk, min_stripe)
    assert sum(length for _, length in chunks) == size
    offset = 0
    for start, length in chunks:
        assert start == offset and 0 < length <= max_chunk
        offset += length
    if size >= streams * min(min_stripe, max_chunk):  # enough bytes: every stream has work
        assert len(chunks) >= min(streams, -(-size // max_chunk))


SECRET = os.urandom(32)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[tcp.DataServer, dict[int, Region]]]:
    regions: dict[int, Region] = {}
    served = tcp.DataServer("127.0.0.1", SECRET, regions.get)
    yield served, regions
    served.close()


@pytest.fixture(scope="module")
def untagging_server() -> Iterator[tuple[tcp.DataServer, dict[int, Region]]]:
    """An owner with ``rdma_tcp_integrity`` off: its answers come in one call each."""
    regions: dict[int, Region] = {}
    served = tcp.DataServer("127.0.0.1", SECRET, regions.get, integrity=False)
    yield served, regions
    served.close()


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 300_000),
    width=st.integers(1, 5),
    max_chunk=st.integers(1_000, 100_000),
    writes=st.booleans(),
    seed=st.binary(min_size=1, max_size=16),
    untagged=st.booleans(),
)
def test_striped_transfers_over_real_sockets_reassemble_exactly(
    server: tuple[tcp.DataServer, dict[int, Region]],
    untagging_server: tuple[tcp.DataServer, dict[int, Region]],
    size: int,
    width: int,
    max_chunk: int,
    writes: bool,
    seed: bytes,
    untagged: bool,
) -> None:
    served, regions = untagging_server if untagged else server
    data = (seed * (size // len(seed) + 1))[:size]
    remote = bytearray(data) if not writes else bytearray(size)
    local = bytearray(size) if not writes else bytearray(data)
    regions[1] = region_of(remote)
    streams = tcp.Streams(served.host, served.port, SECRET, integrity=not untagged)
    with Executor(4) as helpers:
        chunks = plan(size, width, max_chunk, 1)
        op = tcp.WRITE if writes else tcp.READ
        tcp.transfer(
            streams, op, 1, region_of(local), size, time.monotonic() + 60, chunks, helpers, width
        )
    streams.close()
    assert remote == local == data


def test_a_wrong_secret_is_refused(server: tuple[tcp.DataServer, dict[int, Region]]) -> None:
    served, _ = server
    streams = tcp.Streams(served.host, served.port, os.urandom(32))
    with pytest.raises(Exception, match=r"handshake|secret"):
        streams.take(time.monotonic() + 30)


# -- the race check -----------------------------------------------------------------------

SPACE = 64
op_strategy = st.tuples(
    st.sampled_from(["read", "write", "fetch_add"]),
    st.integers(0, 2),  # which remote array
    st.integers(0, SPACE - 8),  # remote start
    st.integers(0, 2),  # which local array
    st.integers(0, SPACE - 8),  # local start
    st.integers(8, 16),  # length
)


def oracle(ops: list[tuple[str, int, int, int, int, int]]) -> bool:
    """Whether the batch is race-free, byte by byte: no byte written by one operation is
    touched by another. Remote arrays 0-2 and local arrays 3-5 are distinct memory."""
    touched: list[tuple[set[tuple[int, int]], set[tuple[int, int]]]] = []
    for kind, remote, rstart, local, lstart, length in ops:
        rlen = 8 if kind == "fetch_add" else min(length, SPACE - rstart, SPACE - lstart)
        remote_bytes = {(remote, b) for b in range(rstart, rstart + rlen)}
        local_bytes = {(3 + local, b) for b in range(lstart, lstart + rlen)}
        if kind == "read":
            touched.append((remote_bytes, local_bytes))  # (reads, writes)
        elif kind == "write":
            touched.append((local_bytes, remote_bytes))
        else:
            touched.append((set(), remote_bytes | local_bytes))
    for j in range(len(touched)):
        for i in range(j):
            ri, wi = touched[i]
            rj, wj = touched[j]
            if wi & (rj | wj) or wj & ri:
                return False
    return True


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op_strategy, max_size=5))
def test_the_race_check_accepts_exactly_the_race_free_batches(
    ops: list[tuple[str, int, int, int, int, int]],
) -> None:
    remotes = [bytearray(SPACE) for _ in range(3)]
    locals_ = [bytearray(SPACE) for _ in range(3)]
    buffers: dict[tuple[int, int, int], RDMABuffer] = {}
    action = RDMAAction()
    accepted, why = True, ""
    try:
        for kind, remote, rstart, local, lstart, length in ops:
            length = 8 if kind == "fetch_add" else min(length, SPACE - rstart, SPACE - lstart)
            key = (remote, rstart, length)
            if key not in buffers:
                buffers[key] = RDMABuffer(memoryview(remotes[remote])[rstart : rstart + length])
            buf = buffers[key]
            dst = memoryview(locals_[local])[lstart : lstart + length]
            if kind == "read":
                action.read_remote(dst, buf)
            elif kind == "write":
                action.write_remote(buf, dst)
            else:
                action.fetch_add(buf, dst, 1)
    except ValueError as error:
        accepted, why = False, str(error)
    finally:
        for buf in buffers.values():
            buf.drop().get(timeout=30)
    assert accepted == oracle(ops)
    assert accepted or "races" in why


@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 50), st.integers(0, 20), st.booleans()),
        max_size=6,
    )
)
def test_first_race_matches_pairwise_byte_overlap(raw: list[tuple[int, int, int, bool]]) -> None:
    ops = [[Access(space, start, start + length, writes)] for space, start, length, writes in raw]
    race = first_race(ops)
    pairs = [
        (i, j)
        for j in range(len(raw))
        for i in range(j)
        if raw[i][0] == raw[j][0]
        and set(range(raw[i][1], raw[i][1] + raw[i][2]))
        & set(range(raw[j][1], raw[j][1] + raw[j][2]))
        and (raw[i][3] or raw[j][3])
    ]
    assert race == (min(pairs, key=lambda p: (p[1], p[0])) if pairs else None)
