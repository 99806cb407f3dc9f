"""Upstream names of parts of Monarch this project does not have: calling one says why and
what to use instead (the name resolves, so a script fails where it uses it, clearly)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NoReturn


def world_mesh(ctx: Any, hosts: Any, gpu_per_host: int, _processes: Any = None) -> NoReturn:
    """Upstream's mesh of the legacy controller (``monarch_supervisor``'s ``Context`` and
    ``Host`` processes), which this project does not have."""
    raise NotImplementedError(
        "world_mesh builds a mesh on upstream's legacy monarch_supervisor controller, which "
        "this project does not have: spawn the procs and activate them instead, "
        '`procs = host_mesh.spawn_procs(per_host={"gpu": n}); with procs.activate(): ...`'
    )


def python_local_mesh(*, gpus: int | None = None, hosts: int = 1) -> NoReturn:
    """Upstream's local mesh on the legacy controller (see ``world_mesh``)."""
    raise NotImplementedError(
        "python_local_mesh runs upstream's legacy monarch_supervisor controller, which this "
        'project does not have: `this_host().spawn_procs(per_host={"hosts": h, "gpus": g})` '
        "and `activate()` it instead"
    )


def Simulator(hosts: int, gpus: int, **options: Any) -> NoReturn:
    """Upstream's simulator of a tensor program (its time and memory on GPUs, a trace)."""
    raise NotImplementedError(
        "Simulator estimates a tensor program's GPU time and memory from a model of CUDA "
        "kernels and NCCL collectives, which this project does not have (its engine runs on "
        "CPU procs): run the program on a mesh of procs instead"
    )


_meta: list[Any] = []


@contextlib.contextmanager
def set_meta(value: Any) -> Iterator[None]:
    """Label the simulator tasks made inside (upstream's). There is no ``Simulator`` here,
    so the label is kept (``current_meta()``) and changes nothing: a program written for
    the simulator runs unchanged."""
    _meta.append(value)
    try:
        yield
    finally:
        _meta.pop()


def current_meta() -> Any:
    """The innermost ``set_meta`` label, or None."""
    return _meta[-1] if _meta else None
