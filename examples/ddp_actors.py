"""DistributedDataParallel inside actors, as in the DDP notebook of Monarch's blog post.

One ``DDPActor`` per proc of a 2-proc mesh. Each sets ``MASTER_ADDR``/``MASTER_PORT``,
``RANK`` and ``WORLD_SIZE`` for itself, joins its own torch.distributed process group (gloo
on CPU, NCCL when the proc has a GPU) and wraps a small model in
``DistributedDataParallel``, which all-reduces the gradients during ``backward``. The
controller drives the training: ``train_step.call()`` runs one step on every rank and
gathers each rank's loss and gradient norm; ``get_system_info.call()`` reports each rank's
pid and device. At the end, the weights are the same on every rank and equal those of the
same loop run in this one process over both ranks' data.

Run it with ``python examples/ddp_actors.py`` (needs torch). Unchanged on a GPU host: each
rank then takes ``cuda:<local rank>`` and NCCL.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from monarch.actor import Actor, current_rank, current_size, endpoint, this_host

WORLD = 2
STEPS = 5
BATCH = 8
LR = 0.1


def model() -> nn.Module:
    torch.manual_seed(0)  # every rank, and the reference, start from the same weights
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s data at ``step`` (its own shard of the global batch)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


class DDPActor(Actor):
    """One rank of data-parallel training: its own process group, its own model replica."""

    def __init__(self, master_addr: str, master_port: int) -> None:
        self.rank = current_rank().rank
        self.world = current_size()["gpus"]
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world),
        )
        if torch.cuda.is_available():
            self.device = torch.device("cuda", self.rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.ddp: DistributedDataParallel | None = None
        self.step = 0

    @endpoint
    def setup(self) -> None:
        """Join the process group (every rank at once: it waits for all) and wrap the model."""
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=60))
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model().to(self.device), device_ids=ids)
        self.optimizer = torch.optim.SGD(self.ddp.parameters(), lr=LR)

    @endpoint
    def train_step(self) -> dict[str, float]:
        """One step on this rank's batch; DDP averages the gradients over the ranks."""
        assert self.ddp is not None, "call setup first"
        x, y = (t.to(self.device) for t in batch(self.rank, self.step))
        self.optimizer.zero_grad()
        loss = nn.functional.mse_loss(self.ddp(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        grads = [p.grad.flatten() for p in self.ddp.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.cat(grads))
        self.optimizer.step()
        self.step += 1
        return {"loss": loss.item(), "grad_norm": norm.item()}

    @endpoint
    def get_system_info(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": str(self.device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
        }

    @endpoint
    def weights(self) -> dict[str, torch.Tensor]:
        assert self.ddp is not None
        return {k: v.detach().cpu() for k, v in self.ddp.module.state_dict().items()}

    @endpoint
    def cleanup(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def reference() -> dict[str, torch.Tensor]:
    """The same training in one process: each step on all ranks' batches together."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(STEPS):
        parts = [batch(rank, step) for rank in range(WORLD)]
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        optimizer.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return {k: v.detach() for k, v in net.state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": WORLD})
    try:
        trainers = procs.spawn("ddp", DDPActor, "127.0.0.1", free_port())
        trainers.setup.call().get(timeout=120)
        for info in trainers.get_system_info.call().get(timeout=60).values():
            print(f"rank {info['rank']}: pid {info['pid']}, {info['device']}, {info['backend']}")
        for step in range(STEPS):
            stats = trainers.train_step.call().get(timeout=60)
            losses = [round(s["loss"], 4) for s in stats.values()]
            norms = [round(s["grad_norm"], 4) for s in stats.values()]
            print(f"step {step}: losses {losses}, grad norms {norms}")
        weights = list(trainers.weights.call().get(timeout=60).values())
        trainers.cleanup.call().get(timeout=60)
    finally:
        procs.stop().get(timeout=60)
    same = all(torch.allclose(weights[0][k], w[k]) for w in weights[1:] for k in w)
    print(f"weights equal on every rank: {same}")
    expected = reference()
    match = all(torch.allclose(weights[0][k], expected[k], atol=1e-6) for k in expected)
    print(f"final weights match the single-process run: {match}")


if __name__ == "__main__":
    main()
