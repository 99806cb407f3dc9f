"""``RDMABuffer`` of CUDA tensors, and CUDA tensors as a transfer's local memory, over the
planes that run without GPUDirect (``_staging``: the owner stages through host copies).
They need a GPU (skipped without one); the project's CI has none."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.config import configured
from monarch.rdma import RDMAAction, RDMABuffer, RDMABufferDropped
from monarch.rdma._registry import registry
from monarch.rdma._transfer import plane

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
    pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning"),
]

MIB = 1024 * 1024


def pattern(size: int, seed: int) -> Any:
    """``size`` random bytes of ``seed``, on the CPU."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)


def sha(data: Any) -> str:
    return hashlib.sha256(data.cpu().numpy().tobytes()).hexdigest()


class GpuOwner(Actor):
    """Owns GPU buffers (by name), and uses others' with GPU memory of its own."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.buffers: dict[str, RDMABuffer] = {}

    @endpoint
    def make(self, name: str, size: int, seed: int) -> RDMABuffer:
        self.data[name] = pattern(size + 64, seed).cuda()
        self.buffers[name] = RDMABuffer(self.data[name][32 : 32 + size])  # a view: offsets
        return self.buffers[name]

    @endpoint
    def digest(self, name: str) -> tuple[str, str]:
        """The buffer's bytes, and the bytes around it (never written)."""
        whole = self.data[name]
        return sha(whole[32:-32]), sha(torch.cat([whole[:32], whole[-32:]]))

    @endpoint
    def read_to_gpu(self, buf: RDMABuffer) -> str:
        out = torch.zeros(buf.size(), dtype=torch.uint8, device="cuda")
        buf.read_into(out).get()
        return sha(out)

    @endpoint
    def write_from_gpu(self, buf: RDMABuffer, size: int, seed: int) -> None:
        buf.write_from(pattern(size, seed).cuda()).get()


@pytest.fixture(scope="module", params=["memory", "tcp"])
def owners(request: pytest.FixtureRequest) -> Iterator[tuple[str, Any]]:
    way = str(request.param)
    with configured(read_peer_buffers=way == "memory"):
        procs: ProcMesh = this_host().spawn_procs(per_host={"procs": 2})
        yield way, procs.spawn("gpu_owners", GpuOwner)
        procs.stop().get(timeout=60)


@pytest.mark.parametrize("size", [1, 8, 3 * MIB + 5])
def test_the_client_reads_and_writes_a_gpu_buffer(owners: tuple[str, Any], size: int) -> None:
    way, actors = owners
    owner = actors.slice(procs=0)
    name = f"rw{size}"
    buf = owner.make.call_one(name, size, 1).get(timeout=60)
    around = owner.digest.call_one(name).get(timeout=60)[1]
    assert plane(buf._handle) == way and buf.size() == size
    on_cpu = bytearray(size)
    buf.read_into(on_cpu).get(timeout=60)
    assert bytes(on_cpu) == pattern(size, 1).numpy().tobytes()
    on_gpu = torch.zeros(size, dtype=torch.uint8, device="cuda")
    buf.read_into(on_gpu).get(timeout=60)
    assert torch.equal(on_gpu.cpu(), pattern(size, 1))
    new = pattern(size, 2)
    buf.write_from(new.cuda()).get(timeout=60)
    assert owner.digest.call_one(name).get(timeout=60) == (sha(new), around)
    newer = pattern(size, 3)
    buf.write_from(newer.numpy().tobytes()).get(timeout=60)
    assert owner.digest.call_one(name).get(timeout=60) == (sha(newer), around)
    buf.drop().get(timeout=60)
    with pytest.raises(RDMABufferDropped):
        buf.read_into(on_cpu).get(timeout=60)


def test_actors_move_gpu_bytes_between_their_gpu_buffers(owners: tuple[str, Any]) -> None:
    _, actors = owners
    owner, other = actors.slice(procs=0), actors.slice(procs=1)
    size = 2 * MIB + 3
    buf = owner.make.call_one("peer", size, 4).get(timeout=60)
    assert other.read_to_gpu.call_one(buf).get(timeout=60) == sha(pattern(size, 4))
    other.write_from_gpu.call_one(buf, size - 1, 5).get(timeout=60)
    expected = torch.cat([pattern(size - 1, 5), pattern(size, 4)[-1:]])
    assert owner.digest.call_one("peer").get(timeout=60)[0] == sha(expected)
    buf.drop().get(timeout=60)


def test_atomics_on_a_gpu_buffer(owners: tuple[str, Any]) -> None:
    _, actors = owners
    counter = actors.slice(procs=0).make.call_one("counter", 8, 6).get(timeout=60)
    counter.write_from(bytes(8)).get(timeout=60)
    old = bytearray(8)
    for _ in range(5):
        RDMAAction().fetch_add(counter, old, 3).submit().get(timeout=60)
    RDMAAction().compare_and_swap(counter, old, 15, 99).submit().get(timeout=60)
    assert int.from_bytes(old, "little") == 15
    now = bytearray(8)
    counter.read_into(now).get(timeout=60)
    assert int.from_bytes(now, "little") == 99
    counter.drop().get(timeout=60)


def test_the_client_s_own_gpu_buffer_is_read_by_an_actor_and_dropped_whole(
    owners: tuple[str, Any],
) -> None:
    _, actors = owners
    before = len(registry)
    data = pattern(MIB + 7, 7).cuda()
    buf = RDMABuffer(data)
    assert len(registry) == before + 2  # the copy readers read, and the one writers write
    assert actors.slice(procs=1).read_to_gpu.call_one(buf).get(timeout=60) == sha(data)
    local = torch.empty_like(data)
    buf.read_into(local).get(timeout=60)
    assert torch.equal(local, data)
    buf.write_from(torch.flip(data, [0])).get(timeout=60)
    assert torch.equal(data, torch.flip(local, [0]))
    buf.drop().get(timeout=60)
    assert len(registry) == before
