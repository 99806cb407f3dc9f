"""A torchrun-style DDP training script (torch.distributed, gloo): every rank trains the
same small model (seeded) on its shard of a fixed data set. Every rank appends a JSON line
to OUT (``ddp_train.py OUT``) with the address it ran at, rank 0's with the mean loss of
each step, which it also prints. Run twice on the same procs, it gives the same losses:
nothing of a run is left in the procs for the next."""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

STEPS = 5


def own_address() -> str:
    """The address this rank reaches the rendezvous from (its host's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((os.environ["MASTER_ADDR"], 1))
        return str(probe.getsockname()[0])


out = sys.argv[1]
dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
try:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=data)
    y = x @ torch.randn(8, 1, generator=data)
    shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[shard]), y[shard])
        # DDP averages the gradients over the ranks (gloo all_reduce)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    line: dict[str, object] = {"rank": rank, "world": world, "address": own_address()}
    if rank == 0:
        print(f"losses {losses}", flush=True)
        line["losses"] = losses
    with open(out, "a") as f:
        f.write(json.dumps(line) + "\n")
finally:
    dist.destroy_process_group()
