"""A parameter server over RDMA buffers, as in Monarch's parameter-server walkthrough.

A ``ParameterServer`` actor holds the weights and one gradient slot per worker, and hands
out ``RDMABuffer`` handles of them. Each step, every worker reads the weights straight out
of the server's memory (``read_into``), computes its gradient and writes it into its slot
(``write_from``); the server then applies the gradients. The weights never travel in an
actor message. At the end, the weights equal those of the same loop run in one process.

Run it with ``python examples/parameter_server.py`` (needs torch and monarch-rdma).
"""

from __future__ import annotations

import warnings

import torch

from monarch.actor import Actor, context, endpoint, this_host
from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8).flatten()


def gradient(weights: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """A worker's gradient: pulls the weights toward a target of its own."""
    target = torch.arange(weights.numel(), dtype=weights.dtype) * (rank + 1) / (step + 1)
    return 2 * (weights - target)


def apply(weights: torch.Tensor, grads: list[torch.Tensor], lr: float) -> None:
    for grad in grads:
        weights.sub_(lr * grad)  # in place: the registered memory stays where it is


class ParameterServer(Actor):
    def __init__(self, size: int, workers: int) -> None:
        warnings.simplefilter("ignore", RDMATcpFallbackWarning)
        self.weights = torch.zeros(size)
        self.grads = [torch.zeros(size) for _ in range(workers)]
        self.weight_buffer = RDMABuffer(as_bytes(self.weights))
        self.grad_buffers = [RDMABuffer(as_bytes(g)) for g in self.grads]

    @endpoint
    def handles(self, rank: int) -> tuple[RDMABuffer, RDMABuffer]:
        return self.weight_buffer, self.grad_buffers[rank]

    @endpoint
    def update(self, lr: float) -> None:
        apply(self.weights, self.grads, lr)

    @endpoint
    def current(self) -> torch.Tensor:
        return self.weights.clone()


class Worker(Actor):
    def __init__(self, size: int) -> None:
        self.weights = torch.empty(size)
        self.grad = torch.empty(size)
        self.buffers: tuple[RDMABuffer, RDMABuffer] | None = None

    @endpoint
    async def step(self, server: ParameterServer, step: int) -> None:
        rank = context().actor_instance.rank.rank
        if self.buffers is None:
            self.buffers = await server.handles.call_one(rank)
        weights, grad = self.buffers
        await weights.read_into(as_bytes(self.weights))
        self.grad.copy_(gradient(self.weights, rank, step))
        await grad.write_from(as_bytes(self.grad))


def reference(size: int, workers: int, steps: int, lr: float) -> torch.Tensor:
    """The same training loop in one process."""
    weights = torch.zeros(size)
    for step in range(steps):
        apply(weights, [gradient(weights, rank, step) for rank in range(workers)], lr)
    return weights


def train(size: int = 1 << 16, workers: int = 2, steps: int = 5, lr: float = 0.1) -> bool:
    """Run the loop on actors and say whether it matched the one-process loop."""
    host = this_host()
    server_procs = host.spawn_procs(per_host={"procs": 1})
    worker_procs = host.spawn_procs(per_host={"procs": workers})
    try:
        server = server_procs.spawn("server", ParameterServer, size, workers)
        trainers = worker_procs.spawn("workers", Worker, size)
        for step in range(steps):
            trainers.step.call(server, step).get()
            server.update.call_one(lr).get()
        final = server.current.call_one().get()
    finally:
        worker_procs.stop().get()
        server_procs.stop().get()
    return bool(torch.equal(final, reference(size, workers, steps, lr)))


if __name__ == "__main__":
    matched = train()
    print(f"final weights match the single-process run: {matched}")
    raise SystemExit(0 if matched else 1)
