"""Upstream's ``monarch.profiler``: ``torch.profiler`` run on every proc, in order with the
tensor program. ``profile(..., on_trace_ready="dir")`` writes each proc's chrome trace to
``dir/trace_<rank>.json`` when it ends (or at each ``schedule`` cycle); ``record_function``
labels a section of the program in those traces. Works on CPU."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch

from monarch.actor import current_rank
from monarch.tensor import remote


class Schedule(NamedTuple):
    """``torch.profiler.schedule``'s arguments (the only ``schedule`` a ``profile`` takes)."""

    wait: int
    warmup: int
    active: int
    repeat: int = 0
    skip_first: int = 0


@dataclass
class _Profiler:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    profiler: torch.profiler.profile | None = None


_profilers: dict[int, _Profiler] = {}
"""The profilers of this proc by id (the controller's ``profile`` objects)."""

_sections: dict[int, Any] = {}
"""The open ``record_function`` sections of this proc by id."""


def _export(prof: torch.profiler.profile, directory: str) -> None:
    path = Path(directory).absolute()
    os.makedirs(path, exist_ok=True)
    rank = _rank()
    prof.export_chrome_trace(f"{path}/trace_{rank}.json")


def _rank() -> int:
    """This proc's rank: torch.distributed's where it is initialized, else the mesh's (two
    procs' traces must not have one name)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_initialized() else current_rank().rank


def _profiler_init(ident: int, *args: Any, **kwargs: Any) -> None:
    if ident in _profilers:
        raise RuntimeError(f"profiler {ident} exists already on this proc")
    _profilers[ident] = _Profiler(args, kwargs)


def _profiler_enter(ident: int) -> None:
    # Made here, not at init: torch's profiler must start on the thread that made it.
    state = _profilers[ident]
    kwargs = dict(state.kwargs)
    kwargs[profile.PATH_KEY] = partial(_export, directory=kwargs[profile.PATH_KEY])
    schedule = kwargs.get("schedule")
    if schedule is not None:
        kwargs["schedule"] = torch.profiler.schedule(**schedule._asdict())
    state.profiler = torch.profiler.profile(*state.args, **kwargs)
    state.profiler.__enter__()  # type: ignore[no-untyped-call]


def _profiler_exit(ident: int) -> None:
    state = _profilers.pop(ident)
    if state.profiler is not None:
        state.profiler.__exit__(None, None, None)  # type: ignore[no-untyped-call]


def _profiler_step(ident: int) -> None:
    prof = _profilers[ident].profiler
    if prof is None:
        raise RuntimeError("profile.step() outside its `with` block")
    prof.step()


def _section_enter(ident: int, name: str, args: str | None) -> None:
    section = torch.profiler.record_function(name, args)
    section.__enter__()  # type: ignore[no-untyped-call]
    _sections[ident] = section


def _section_exit(ident: int) -> None:
    _sections.pop(ident).__exit__(None, None, None)


_init = remote(_profiler_init, propagate="inspect")
_enter = remote(_profiler_enter, propagate="inspect")
_exit = remote(_profiler_exit, propagate="inspect")
_step = remote(_profiler_step, propagate="inspect")
_open_section = remote(_section_enter, propagate="inspect")
_close_section = remote(_section_exit, propagate="inspect")
_ids = itertools.count()


class profile:
    """``torch.profiler.profile(*args, **kwargs)`` on every proc of the active mesh;
    ``on_trace_ready`` is the directory of the traces, ``schedule`` a ``Schedule``."""

    PATH_KEY = "on_trace_ready"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not isinstance(kwargs.get(self.PATH_KEY), str):
            raise ValueError(f"profile needs {self.PATH_KEY}=, the directory of the traces")
        schedule = kwargs.get("schedule")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError("profile's schedule is a monarch.profiler.Schedule")
        self.id = next(_ids)
        _init(self.id, *args, **kwargs)

    def __enter__(self) -> profile:
        _enter(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        _exit(self.id)

    def step(self) -> None:
        """``prof.step()`` on every proc (the schedule's clock)."""
        _step(self.id)


@dataclass
class record_function:
    """``torch.profiler.record_function(name, args)`` around a section of the program, on
    every proc of the active mesh."""

    name: str
    args: str | None = None
    id: int = field(default_factory=lambda: next(_ids))

    def __enter__(self) -> record_function:
        _open_section(self.id, self.name, self.args)
        return self

    def __exit__(self, *exc: object) -> None:
        _close_section(self.id)


__all__ = ["Schedule", "profile", "record_function"]
