"""The issue's example: a small MLP trained data-parallel under ``activate()``, gradients
averaged with ``reduce_``; its losses are those of the same loop run in one process."""

from __future__ import annotations

import torch
from torch import nn

from monarch.actor import ProcMesh
from monarch.tensor import Tensor, inspect, rank_tensor

STEPS = 4


def model_from(init: list[torch.Tensor]) -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.no_grad():
        for param, value in zip(model.parameters(), init, strict=True):
            param.copy_(value)
    return model


def step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, dp: bool
) -> torch.Tensor:
    opt.zero_grad()
    loss: torch.Tensor = ((model(x) - y) ** 2).mean()
    loss.backward()  # type: ignore[no-untyped-call]
    if dp:
        for param in model.parameters():
            grad = param.grad
            assert isinstance(grad, Tensor)
            grad.reduce_("gpus", "avg")
    opt.step()
    return loss


def test_data_parallel_mlp_matches_the_local_loop(procs: ProcMesh) -> None:
    generator = torch.Generator().manual_seed(0)
    shapes = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    init = [p.detach().clone() for p in shapes.parameters()]
    x_all = torch.randn(8, 4, generator=generator)
    y_all = torch.randn(8, 1, generator=generator)

    local = model_from(init)
    local_opt = torch.optim.SGD(local.parameters(), lr=0.1)
    expected = [step(local, local_opt, x_all, y_all, dp=False).item() for _ in range(STEPS)]

    with procs.activate():
        model = model_from(init)
        assert all(isinstance(p, Tensor) for p in model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        rows = torch.arange(4) + rank_tensor("gpus") * 4  # each proc its half of the batch
        x = torch.index_select(torch.zeros(8, 4) + x_all, 0, rows)
        y = torch.index_select(torch.zeros(8, 1) + y_all, 0, rows)
        losses = []
        for _ in range(STEPS):
            loss = step(model, opt, x, y, dp=True)
            assert isinstance(loss, Tensor)
            losses.append(loss.reduce("gpus", "avg"))
    got = [inspect(loss).item() for loss in losses]
    torch.testing.assert_close(got, expected)
    # both procs hold the same weights after the averaged steps
    weights = next(iter(model.parameters()))
    torch.testing.assert_close(inspect(weights, gpus=0), inspect(weights, gpus=1))
    torch.testing.assert_close(inspect(weights, gpus=1), next(iter(local.parameters())).detach())
