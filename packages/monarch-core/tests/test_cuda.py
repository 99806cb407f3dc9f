"""CUDA tensors in actor messages, and a script that used its GPU before importing monarch.

These need a GPU (they are skipped without one): the project's CI has none; they are run on
a lent GPU machine (the core README, "GPUs", says how).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Actor, ProcMesh, endpoint, this_host

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


class OnGpu(Actor):
    @endpoint
    def seen(self, t: Any) -> tuple[str, Any]:
        """Where the tensor arrived, and its values copied to the CPU."""
        return t.device.type, t.cpu()

    @endpoint
    def double(self, t: Any) -> Any:
        return t * 2

    @endpoint
    def made(self, n: int) -> Any:
        return torch.arange(n, device="cuda", dtype=torch.float32)


@pytest.fixture(scope="module")
def gpu_procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"procs": 2})
    yield mesh
    mesh.stop().get(timeout=60)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (1 << 20,)])
def test_a_cuda_tensor_arrives_on_the_gpu_with_its_values(
    gpu_procs: ProcMesh, dtype: Any, shape: tuple[int, ...]
) -> None:
    actors = gpu_procs.spawn("on_gpu", OnGpu)
    sent = (torch.rand(shape, device="cuda") * 100).to(dtype)
    expected = sent.cpu()
    replies = actors.seen.call(sent).get(timeout=60)
    sent.zero_()  # the call returned: the receivers hold their own copies
    for _, (device, values) in replies.items():
        assert device == "cuda"
        assert torch.equal(values, expected)


def test_a_non_contiguous_cuda_tensor_keeps_its_values(gpu_procs: ProcMesh) -> None:
    actors = gpu_procs.spawn("on_gpu_t", OnGpu)
    sent = torch.rand(64, 48, device="cuda").t()[::2]
    replies = actors.seen.call(sent).get(timeout=60)
    for _, (_, values) in replies.items():
        assert torch.equal(values, sent.cpu())


def test_cuda_tensors_come_back_to_the_client_on_its_gpu(gpu_procs: ProcMesh) -> None:
    actors = gpu_procs.spawn("on_gpu_back", OnGpu)
    one = actors.slice(procs=1)
    back = one.made.call_one(6).get(timeout=60)
    assert back.device.type == "cuda"
    assert torch.equal(back.cpu(), torch.arange(6, dtype=torch.float32))
    sent = torch.randn(1000, device="cuda")
    doubled = one.double.call_one(sent).get(timeout=60)
    assert doubled.device.type == "cuda"
    torch.testing.assert_close(doubled, sent * 2)


def test_a_script_that_used_its_gpu_before_monarch_still_gets_gpu_procs(tmp_path: Path) -> None:
    """A fork of a process holding a CUDA context can never use CUDA: the zygote is not
    forked from such a script."""
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            warm = torch.ones(3, device="cuda") * 2  # the script's CUDA context, first
            from monarch.actor import Actor, endpoint, this_host

            class Gpu(Actor):
                @endpoint
                def total(self) -> float:
                    return float(torch.arange(4.0, device="cuda").sum())

            procs = this_host().spawn_procs(per_host={"procs": 2})
            print(sorted(procs.spawn("gpu", Gpu).total.call().get(timeout=60).values()))
            procs.stop().get(timeout=60)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[6.0, 6.0]"
