"""The timer's functions as remote functions: inside ``activate()`` each runs on every proc,
in order with the tensor ops (the names upstream's ``example_monarch.py`` imports)."""

from __future__ import annotations

import torch

from monarch.tensor import remote

from . import execution_timer as _timer


def _scalar(*args: object, **kwargs: object) -> torch.Tensor:
    return torch.empty((), dtype=torch.float64)


execution_timer_start = remote(_timer.execution_timer_start, propagate="inspect")
execution_timer_stop = remote(_timer.execution_timer_stop, propagate="inspect")
get_execution_timer_average_ms = remote(_timer.get_execution_timer_average_ms, propagate=_scalar)
get_latest_timer_measurement = remote(_timer.get_latest_timer_measurement, propagate=_scalar)
get_time_perfcounter = remote(_timer.get_time_perfcounter, propagate=_scalar)
reset = remote(_timer.ExecutionTimer.reset, propagate="inspect")

__all__ = [
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
    "reset",
]
