"""Named timers of sections of a process's work, kept per process (upstream's
``ExecutionTimer``, with its function names).

Upstream times CUDA work with CUDA events, by default. Here a section is timed on the
host's clock; on a CUDA machine (``use_cpu=False``) the device is synchronized at the
start and the end of a section so that the time covers its kernels (untested here: no
GPU). Times are in milliseconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import torch

DEFAULT = "default"


class ExecutionTimer:
    """The process's timers: ``start(name)``/``stop(name)`` (or ``with time(name):``) add a
    measurement to ``name``; ``summary()`` gives count, mean, total, min and max."""

    _lock = threading.Lock()
    _times: ClassVar[dict[str, list[float]]] = {}
    _started: ClassVar[dict[str, list[float]]] = {}

    @classmethod
    @contextmanager
    def time(cls, name: str | None = None, use_cpu: bool = False) -> Iterator[None]:
        cls.start(name, use_cpu)
        try:
            yield
        finally:
            cls.stop(name, use_cpu)

    @classmethod
    def start(cls, name: str | None = None, use_cpu: bool = False) -> None:
        _synchronize(use_cpu)
        with cls._lock:
            cls._times.setdefault(name or DEFAULT, [])
            cls._started.setdefault(name or DEFAULT, []).append(time.perf_counter())

    @classmethod
    def stop(cls, name: str | None = None, use_cpu: bool = False) -> None:
        _synchronize(use_cpu)
        now = time.perf_counter()
        key = name or DEFAULT
        with cls._lock:
            started = cls._started.get(key)
            if not started:
                raise RuntimeError(f"ExecutionTimer.stop({key!r}) without a start({key!r})")
            cls._times[key].append((now - started.pop()) * 1000.0)

    @classmethod
    def reset(cls) -> None:
        """Forget every measurement (and every section still started)."""
        with cls._lock:
            cls._times = {}
            cls._started = {}

    @classmethod
    def summary(cls) -> dict[str, dict[str, float]]:
        with cls._lock:
            return {
                name: {
                    "count": len(times),
                    "mean_ms": sum(times) / len(times),
                    "total_ms": sum(times),
                    "min_ms": min(times),
                    "max_ms": max(times),
                }
                for name, times in cls._times.items()
                if times
            }

    @classmethod
    def get_latest_measurement(cls, name: str | None = None) -> float:
        """The last measurement of ``name`` in ms (0.0 when there is none, as upstream's)."""
        with cls._lock:
            times = cls._times.get(name or DEFAULT)
            return times[-1] if times else 0.0


def _synchronize(use_cpu: bool) -> None:
    if not use_cpu and torch.cuda.is_available():
        torch.cuda.synchronize()


def execution_timer_start(name: str | None = None, use_cpu: bool = False) -> None:
    ExecutionTimer.start(name, use_cpu)


def execution_timer_stop(name: str | None = None, use_cpu: bool = False) -> None:
    ExecutionTimer.stop(name, use_cpu)


def get_execution_timer_average_ms(name: str = DEFAULT) -> torch.Tensor:
    """The mean of ``name``'s measurements, as a float64 tensor (a remote function's result)."""
    found = ExecutionTimer.summary().get(name)
    if found is None:
        raise KeyError(f"no measurement of {name!r}")
    return torch.tensor(found["mean_ms"], dtype=torch.float64)


def get_latest_timer_measurement(name: str | None = None) -> torch.Tensor:
    return torch.tensor(ExecutionTimer.get_latest_measurement(name), dtype=torch.float64)


def get_execution_timer_summary() -> dict[str, dict[str, float]]:
    return ExecutionTimer.summary()


def get_time_perfcounter() -> torch.Tensor:
    """The process's ``time.perf_counter()`` as a float64 tensor (for differences)."""
    return torch.tensor(time.perf_counter(), dtype=torch.float64)
