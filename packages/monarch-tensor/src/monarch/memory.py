"""Upstream's ``monarch.memory``: CUDA allocator snapshots of every proc, in order with the
tensor program (``torch.cuda.memory``). They need CUDA on the procs: on a proc without it
the call fails there, saying so (the fetch of a value recorded later is unaffected)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch

from monarch.actor import current_rank
from monarch.tensor import remote

PATH_KEY = "dir_snapshots"
_counter = itertools.count()


def _rank() -> int:
    """This proc's rank: torch.distributed's where it is initialized, else the mesh's (two
    procs' files must not have one name)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_initialized() else current_rank().rank


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"monarch.memory.{what} records CUDA's allocator: CUDA is not available on this "
            "proc (torch.cuda.is_available() is False)"
        )


def _record() -> None:
    _need_cuda("record_memory_history()")
    torch.cuda.memory._record_memory_history()


def _dump(ident: int, *args: Any, **kwargs: Any) -> None:
    _need_cuda("dump_memory_snapshot()")
    directory = Path(kwargs[PATH_KEY]).absolute()
    os.makedirs(directory, exist_ok=True)
    rank = _rank()
    path = f"{directory}/snapshot_{rank}.pickle"
    torch.cuda.memory._dump_snapshot(filename=path)  # type: ignore[no-untyped-call]


record_memory_history = remote(_record, propagate="inspect")
"""Start recording the CUDA allocator's history on every proc."""

_memory_controller_dump = remote(_dump, propagate="inspect")


def dump_memory_snapshot(*args: Any, **kwargs: Any) -> None:
    """Each proc writes ``snapshot_<rank>.pickle`` to ``dir_snapshots=`` (required)."""
    if not isinstance(kwargs.get(PATH_KEY), str):
        raise ValueError(f"dump_memory_snapshot needs {PATH_KEY}=, the directory (a string)")
    _memory_controller_dump(next(_counter), *args, **kwargs)


__all__ = ["PATH_KEY", "dump_memory_snapshot", "record_memory_history"]
