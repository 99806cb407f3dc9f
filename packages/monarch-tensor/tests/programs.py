"""Functions the tests run on workers (sent by value: see conftest)."""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed

from monarch.actor import Actor, current_rank, endpoint


def fail_on_rank(t: torch.Tensor, rank: int) -> torch.Tensor:
    """``t + 0``, except that it raises on proc ``rank`` (a data-dependent failure)."""
    if t.device.type != "meta" and current_rank().rank == rank:
        raise ValueError(f"refused on rank {rank}")
    return t + 0


def scaled(t: torch.Tensor, by: float) -> torch.Tensor:
    return t * by


def split_halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    half = t.shape[0] // 2
    return t[:half].clone(), t[half:].clone()


def positives(t: torch.Tensor) -> torch.Tensor:
    """A result whose shape depends on the values (a boolean mask): no meta run says it."""
    return t[t > 0]


def positives_and_count(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A tensor and a plain value: the value comes back from the first proc's run."""
    kept = t[t > 0]
    return kept, int(kept.numel())


def all_summed(t: torch.Tensor, group: Any) -> torch.Tensor:
    """torch.distributed's all_reduce over the process group the worker gives."""
    out = t.clone()
    torch.distributed.all_reduce(out, group=group)
    return out


def group_size(group: Any) -> tuple[int, int]:
    return group.rank(), group.size()


def add_in_place(t: torch.Tensor) -> None:
    t.add_(1)


def plus_one(t: torch.Tensor) -> torch.Tensor:
    return t + 1


def plus_sum_of(t: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return t + other.sum()


def first_row(t: torch.Tensor) -> torch.Tensor:
    """A view of its input (on the workers as here)."""
    return t[0]


def transposed(t: torch.Tensor) -> torch.Tensor:
    """A view of its input."""
    return t.t()


def same(t: torch.Tensor) -> torch.Tensor:
    """Its input itself."""
    return t


def bumped(t: torch.Tensor, by: float) -> torch.Tensor:
    """Writes its input and returns it (an in-place function)."""
    t.add_(by)
    return t


def exit_on_rank(t: torch.Tensor, rank: int) -> torch.Tensor:
    """Ends proc ``rank`` at once (a crash, as far as the mesh can tell)."""
    if t.device.type != "meta" and current_rank().rank == rank:
        os._exit(3)
    return t + 0


class Modules(Actor):
    """Says what its proc had imported when it started (before anything it ran imported)."""

    def __init__(self) -> None:
        self.at_start = set(sys.modules)

    @endpoint
    def had(self, name: str) -> bool:
        return name in self.at_start


class Maker(Actor):
    """An actor whose class travels by value: unpickling it imports torch on the proc."""

    @endpoint
    def make(self, n: int) -> torch.Tensor:
        return torch.arange(float(n))


class ShardUser(Actor):
    """Takes monarch Tensors in its endpoints: each call gets its proc's shard."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []

    @endpoint
    def total(self, t: torch.Tensor, scale: float = 1.0) -> float:
        assert type(t) is torch.Tensor  # a plain local tensor here, not a monarch one
        return float(t.sum()) * scale

    @endpoint
    def pair(self, pair: dict[str, torch.Tensor]) -> list[float]:
        return [float(pair["a"].sum()), float(pair["b"].sum())]

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def bump(self, t: torch.Tensor) -> None:
        """Changes the shard itself (it is the worker's, not a copy)."""
        t.add_(1)


class AsyncShardUser(Actor):
    @endpoint
    async def total(self, t: torch.Tensor) -> float:
        return float(t.sum())


def describe(t: torch.Tensor, extra: float = 0.0) -> dict[str, float]:
    """A non-tensor result: which rank, and its shard's sum."""
    return {"rank": current_rank().rank, "sum": float(t.sum()) + extra}


def bump_(t: torch.Tensor) -> None:
    t.add_(1)


def where() -> tuple[int, torch.Tensor]:
    return current_rank().rank, torch.arange(3.0, requires_grad=True) * 2


class Doubler(Actor):
    """An endpoint whose result becomes a monarch Tensor through ``rref``."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    @endpoint(propagate=lambda t: t.clone())
    def double(self, t: torch.Tensor) -> torch.Tensor:
        self.seen.append(float(t.sum()))
        return t * 2 + os.getpid() % 2  # which proc made it (its rank is 0: see _rref)

    @endpoint
    def sums(self) -> list[float]:
        return self.seen

    @endpoint
    def plain(self, t: torch.Tensor) -> torch.Tensor:
        return t


def make_linear(seed: int) -> Any:
    """A model that stays on the worker: the controller holds an ``OpaqueRef`` to it."""
    from monarch import OpaqueRef

    torch.manual_seed(seed)
    return OpaqueRef(torch.nn.Linear(3, 2))


def apply_linear(ref: Any, x: torch.Tensor) -> torch.Tensor:
    model = ref.value
    if x.device.type == "meta":  # the controller's shapes: the model is not there
        return torch.empty(x.shape[0], 2)
    result: torch.Tensor = model(x).detach()
    return result


def scale_linear_(ref: Any, by: float) -> None:
    with torch.no_grad():
        ref.value.weight.mul_(by)


def square_with_own_backward(x: torch.Tensor) -> Any:
    """``x * x`` whose backward is said by hand (and doubled, so it is seen to be used)."""
    result = x * x

    def backward(grad: torch.Tensor) -> torch.Tensor:
        return grad * 4 * x

    return result, backward


def held_until(t: torch.Tensor, path: str) -> torch.Tensor:
    """``t + 0`` once ``path`` exists (at most 60 s): an op as long as the test wants."""
    import time

    if t.device.type != "meta":
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} never appeared")
            time.sleep(0.005)
    return t + 0


def slow_copy(t: torch.Tensor, seconds: float) -> torch.Tensor:
    """``t.clone()`` read after a pause: a read that a write racing it would change."""
    import time

    if t.device.type != "meta":
        time.sleep(seconds)
    return t.clone()


def rank_sized(t: torch.Tensor) -> torch.Tensor:
    """A result with as many elements as the proc's rank + 1 (a shape that differs)."""
    return t.new_ones(current_rank().rank + 1)


def loader(pipe: Any, batch: int) -> Any:
    """A data loader for a pipe: batches numbered per proc, then what it was sent, doubled."""
    for step in range(2):
        yield {"x": torch.full((batch, 2), float(step + 10 * pipe.ranks["gpus"])), "n": step}
    sent = pipe.recv()
    yield {"x": sent * 2, "n": 2}


def loader_shapes(pipe: Any, batch: int) -> Any:
    """The controller's side of ``loader``: what it yields, shaped alike."""
    for step in range(2):
        yield {"x": torch.empty(batch, 2), "n": step}
    yield {"x": pipe.recv() * 2, "n": 2}


def failing_loader(pipe: Any) -> Any:
    yield torch.zeros(1)
    raise ValueError("the loader broke")


def one_shape(pipe: Any) -> Any:
    while True:
        yield torch.empty(1)


class Weighted(Actor):
    """Takes a monarch Tensor in its constructor (its proc's shard) and in its calls."""

    def __init__(self, w: torch.Tensor) -> None:
        assert type(w) is torch.Tensor
        self.w = w.clone()  # as it was at the spawn: later ops on the tensor do not reach it

    @endpoint
    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y * 2 + self.w

    def scaled(self, y: torch.Tensor) -> torch.Tensor:
        """A plain method (no ``@endpoint``): called through ``as_endpoint``."""
        return y * 3 + self.w


def gpu_training_step(model: Any, optim: Any, step: int) -> torch.Tensor:
    """One step of a program written for GPUs (``device="cuda"``), without randomness."""
    states = torch.linspace(-1.0, 1.0, 8, device="cuda").reshape(2, 4) * (step + 1)
    logits = model(states)
    loss = (torch.log_softmax(logits, dim=-1) ** 2).mean()
    optim.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    return loss.detach()


def gpu_model() -> tuple[Any, Any]:
    torch.set_default_device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape) / (i + 1))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    return model, optim


class GpuTrainer(Actor):
    """Upstream's GRPO-with-tensor-engine shape: the actor activates its own proc mesh."""

    def __init__(self) -> None:
        from monarch.actor import context

        self.proc_mesh = context().actor_instance.proc_mesh
        with self.proc_mesh.activate():
            self.model, self.optim = gpu_model()
        self.steps = 0

    @endpoint
    async def train_step(self) -> float:
        from monarch.fetch import fetch_shard

        with self.proc_mesh.activate():
            loss = gpu_training_step(self.model, self.optim, self.steps)
            value = await fetch_shard(loss)
        self.steps += 1
        return float(value.item())

    @endpoint
    async def made_on_mesh(self) -> bool:
        """Whether a tensor made inside ``activate()`` is a monarch Tensor."""
        from monarch.tensor import Tensor

        with self.proc_mesh.activate():
            return isinstance(torch.ones(2), Tensor)


def make_linear_module() -> Any:
    """A module made on each worker (``OpaqueModule``'s constructor, by value)."""
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


class Counter:
    """An object kept on each worker (``OpaqueObject``)."""

    def __init__(self, start: torch.Tensor) -> None:
        self.total = start.clone()

    def add(self, t: torch.Tensor) -> torch.Tensor:
        self.total += t
        return self.total.clone()


class Doubled(torch.autograd.Function):
    """A custom autograd function: its backward scales by 3 (not the true 2), so a test
    sees that it ran."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 3
