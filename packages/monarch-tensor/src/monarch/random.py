"""Upstream's ``monarch.random``: the random number state of every proc as monarch Tensors
(``State(cpu, cuda)``), in order with the tensor program. ``make_deterministic`` works on
CPU; the state functions read and write CUDA's generator too, so on a proc without CUDA
they fail there, saying so (the fetch of the state raises that error)."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch

from monarch.tensor import Tensor, remote

_CUDA_STATE = 16  # bytes of a CUDA generator's state (Philox seed and offset)


class State(NamedTuple):
    cpu: Tensor
    cuda: Tensor


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"monarch.random.{what} reads and writes CUDA's generator too: CUDA is not "
            "available on this proc (torch.cuda.is_available() is False)"
        )


def _state_shapes() -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.empty(torch.get_rng_state().shape, dtype=torch.uint8),
        torch.empty(_CUDA_STATE, dtype=torch.uint8),
    )


def _read_state() -> tuple[torch.Tensor, torch.Tensor]:
    _need_cuda("get_state()")
    return (torch.get_rng_state(), torch.cuda.get_rng_state())


def _write_state(state: tuple[torch.Tensor, torch.Tensor]) -> None:
    _need_cuda("set_state()")
    cpu, device = state
    torch.set_rng_state(cpu)
    torch.cuda.set_rng_state(device)


def _seed(seed: torch.Tensor) -> None:
    torch.manual_seed(int(seed.item()))


def _deterministic() -> None:
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (torch's docs)


_get_state = remote(_read_state, propagate=_state_shapes)
set_state = remote(_write_state, propagate=lambda state: None)
"""Every proc's generators from its shards of a ``State``."""
_manual_seed = remote(_seed, propagate=lambda seed: None)
make_deterministic = remote(_deterministic, propagate=lambda: None)
"""Deterministic algorithms on every proc (torch's, cuDNN's and cuBLAS's settings)."""


def get_state() -> State:
    """Every proc's generator states."""
    cpu, cuda = _get_state()
    return State(cpu, cuda)  # type: ignore[arg-type] # monarch Tensors on a mesh


def new_state(seed: Any) -> State:
    """The states that seeding with ``seed`` (a monarch Tensor, each proc's) gives, leaving
    the procs' current states as they were."""
    orig = get_state()
    _manual_seed(seed)
    mine = get_state()
    set_state(orig)
    return mine


__all__ = ["State", "get_state", "make_deterministic", "new_state", "set_state"]
