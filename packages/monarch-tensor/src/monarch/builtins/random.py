"""The random number state of the workers (upstream's ``monarch.builtins.random``). The
CUDA variants need CUDA on the procs (untested here: no GPU)."""

from __future__ import annotations

import torch

from monarch.tensor import remote


def _set_manual_seed(seed: int, process_idx: int = 0) -> None:
    torch.manual_seed(seed ^ process_idx)


def _state_meta() -> torch.Tensor:
    return torch.empty(torch.get_rng_state().shape, dtype=torch.uint8)


def _seed() -> None:
    torch.seed()


def _cuda_states_meta() -> list[torch.Tensor]:
    raise NotImplementedError(
        "get_rng_state_all_cuda_remote: the number of CUDA devices of the procs is not known "
        "on the controller; fetch torch.cuda.get_rng_state_all() with call_on_shard_and_fetch"
    )


set_manual_seed_remote = remote(_set_manual_seed, propagate="inspect")
"""``set_manual_seed_remote(seed, process_idx=0)``: ``torch.manual_seed(seed ^ process_idx)``
on every proc (pass ``rank_tensor(...)``-derived ``process_idx`` through a remote function
for per-rank streams of numbers)."""

get_rng_state_remote = remote(torch.get_rng_state, propagate=_state_meta)
"""Each proc's CPU generator state, as a monarch Tensor."""

set_rng_state_remote = remote(torch.set_rng_state, propagate="inspect")
"""``set_rng_state_remote(state)``: each proc's generator from its shard of ``state``."""

seed_remote = remote(_seed, propagate="inspect")
"""A non-deterministic seed on every proc (each its own)."""

random_seed_remote = seed_remote

manual_seed_cuda_remote = remote(torch.cuda.manual_seed, propagate="inspect")
manual_seed_all_cuda_remote = remote(torch.cuda.manual_seed_all, propagate="inspect")
get_rng_state_all_cuda_remote = remote(torch.cuda.get_rng_state_all, propagate=_cuda_states_meta)
set_rng_state_all_cuda_remote = remote(torch.cuda.set_rng_state_all, propagate="inspect")
