"""Functions the tensor benchmark runs with ``remote``: a module of their own, importable by
name on every proc (the workload puts this folder on ``PYTHONPATH``), because upstream's
``remote`` sends a function by its module and name."""

from __future__ import annotations

import torch


def add_one(t: torch.Tensor) -> torch.Tensor:
    return t + 1
