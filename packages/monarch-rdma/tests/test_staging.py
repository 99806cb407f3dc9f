"""Buffers staged through host copies (``_staging``): an ``RDMABuffer`` of a CUDA tensor,
and CUDA tensors as a transfer's local memory, over the planes that run without GPUDirect.

The same protocol runs without a GPU on a CPU tensor registered as a GPU's would be
(``lend_staged``): every test runs so in CI; with CUDA (a lent GPU machine) they also run
on the GPU (``device`` ``cuda``), where a transfer's local memory is a CUDA tensor too."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.config import configured
from monarch.rdma import RDMAAction, RDMABuffer, RDMABufferDropped
from monarch.rdma._buffer import lend_staged
from monarch.rdma._registry import registry
from monarch.rdma._transfer import plane

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")

MIB = 1024 * 1024
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
    ),
]


def pattern(size: int, seed: int) -> torch.Tensor:
    """``size`` random bytes of ``seed``, on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)


def sha(data: torch.Tensor) -> str:
    return hashlib.sha256(data.cpu().numpy().tobytes()).hexdigest()


def staged(tensor: torch.Tensor) -> RDMABuffer:
    """``tensor`` as a staged buffer: a CUDA tensor is one by itself."""
    return RDMABuffer(tensor) if tensor.is_cuda else RDMABuffer._of(lend_staged(tensor))


class StagedOwner(Actor):
    """Owns staged buffers (by name), and uses others' with memory on ``device``."""

    def __init__(self) -> None:
        self.data: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, RDMABuffer] = {}

    @endpoint
    def make(self, name: str, size: int, seed: int, device: str) -> RDMABuffer:
        around = (pattern(32, seed + 1000), pattern(32, seed + 2000))
        self.data[name] = torch.cat([around[0], pattern(size, seed), around[1]]).to(device)
        self.buffers[name] = staged(self.data[name][32 : 32 + size])  # a view: offsets
        return self.buffers[name]

    @endpoint
    def digest(self, name: str) -> tuple[str, str]:
        """The buffer's bytes, and the bytes around it (never written)."""
        whole = self.data[name]
        return sha(whole[32:-32]), sha(torch.cat([whole[:32], whole[-32:]]))

    @endpoint
    def read_to(self, buf: RDMABuffer, device: str) -> str:
        out = torch.zeros(buf.size(), dtype=torch.uint8, device=device)
        buf.read_into(out).get()
        return sha(out)

    @endpoint
    def write_from(self, buf: RDMABuffer, size: int, seed: int, device: str) -> None:
        buf.write_from(pattern(size, seed).to(device)).get()


@pytest.fixture(scope="module", params=["memory", "tcp"])
def owners(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    way = str(request.param)
    with configured(read_peer_buffers=way == "memory"):
        procs: ProcMesh = this_host().spawn_procs(per_host={"procs": 2})
        yield way, procs.spawn("staged_owners", StagedOwner)
        procs.stop().get(timeout=60)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [1, 8, 3 * MIB + 5])
def test_the_client_reads_and_writes_a_staged_buffer(
    owners: tuple[str, Any], size: int, device: str
) -> None:
    way, actors = owners
    owner = actors.slice(procs=0)
    name = f"rw{size}{device}"
    buf = owner.make.call_one(name, size, 1, device).get(timeout=60)
    around = owner.digest.call_one(name).get(timeout=60)[1]
    assert plane(buf._handle) == way and buf.size() == size
    assert buf._handle.inbox is not None
    on_cpu = bytearray(size)
    buf.read_into(on_cpu).get(timeout=60)
    assert bytes(on_cpu) == pattern(size, 1).numpy().tobytes()
    local = torch.zeros(size, dtype=torch.uint8, device=device)
    buf.read_into(local).get(timeout=60)
    assert torch.equal(local.cpu(), pattern(size, 1))
    new = pattern(size, 2)
    buf.write_from(new.to(device)).get(timeout=60)
    assert owner.digest.call_one(name).get(timeout=60) == (sha(new), around)
    newer = pattern(size, 3)
    buf.write_from(newer.numpy().tobytes()).get(timeout=60)
    assert owner.digest.call_one(name).get(timeout=60) == (sha(newer), around)
    buf.drop().get(timeout=60)
    with pytest.raises(RDMABufferDropped):
        buf.read_into(on_cpu).get(timeout=60)


@pytest.mark.parametrize("device", DEVICES)
def test_actors_move_bytes_between_their_staged_buffers(
    owners: tuple[str, Any], device: str
) -> None:
    _, actors = owners
    owner, other = actors.slice(procs=0), actors.slice(procs=1)
    size = 2 * MIB + 3
    buf = owner.make.call_one(f"peer{device}", size, 4, device).get(timeout=60)
    assert other.read_to.call_one(buf, device).get(timeout=60) == sha(pattern(size, 4))
    other.write_from.call_one(buf, size - 1, 5, device).get(timeout=60)
    expected = torch.cat([pattern(size - 1, 5), pattern(size, 4)[-1:]])
    assert owner.digest.call_one(f"peer{device}").get(timeout=60)[0] == sha(expected)
    buf.drop().get(timeout=60)


@pytest.mark.parametrize("device", DEVICES)
def test_atomics_on_a_staged_buffer(owners: tuple[str, Any], device: str) -> None:
    _, actors = owners
    owner = actors.slice(procs=0)
    counter = owner.make.call_one(f"counter{device}", 8, 6, device).get(timeout=60)
    counter.write_from(bytes(8)).get(timeout=60)
    old = bytearray(8)
    for _ in range(5):
        RDMAAction().fetch_add(counter, old, 3).submit().get(timeout=60)
    RDMAAction().compare_and_swap(counter, old, 15, 99).submit().get(timeout=60)
    assert int.from_bytes(old, "little") == 15
    expected = torch.tensor([99], dtype=torch.int64).view(torch.uint8)
    assert owner.digest.call_one(f"counter{device}").get(timeout=60)[0] == sha(expected)
    counter.drop().get(timeout=60)


@pytest.mark.parametrize("device", DEVICES)
def test_the_client_s_own_staged_buffer_is_read_by_an_actor_and_dropped_whole(
    owners: tuple[str, Any], device: str
) -> None:
    _, actors = owners
    before = len(registry)
    data = pattern(MIB + 7, 7).to(device)
    buf = staged(data)
    assert len(registry) == before + 2  # the copy readers read, and the one writers write
    assert actors.slice(procs=1).read_to.call_one(buf, device).get(timeout=60) == sha(data)
    local = torch.empty_like(data)
    buf.read_into(local).get(timeout=60)
    assert torch.equal(local, data)
    buf.write_from(torch.flip(data, [0])).get(timeout=60)
    assert torch.equal(data, torch.flip(local, [0]))
    buf.drop().get(timeout=60)
    assert len(registry) == before
