"""Job kinds by name: the ``monarch.job_backends`` entry points (this package registers
``local``, ``process``, ``slurm``, ``ssh`` and ``kubernetes``; other wheels may add their
own), read once and loaded on first use."""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points

from monarch.core import install_hint

from ._trait import JobTrait

GROUP = "monarch.job_backends"


@cache
def _registered() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def job_backend(name: str) -> type[JobTrait]:
    """The job class registered as ``name`` (``job_backend("slurm")`` is ``SlurmJob``).
    An unknown name raises LookupError listing those installed."""
    found = _registered().get(name)
    if found is None:
        known = ", ".join(sorted(_registered())) or "none"
        raise LookupError(
            f"no job backend {name!r} (installed: {known}; monarch-jobs provides local, "
            "process, slurm, ssh, and kubernetes with the kubernetes extra: "
            f"{install_hint('monarch-jobs', 'kubernetes')})"
        )
    loaded = found.load()
    if not (isinstance(loaded, type) and issubclass(loaded, JobTrait)):
        raise LookupError(f"job backend {name!r} ({found.value}) is not a JobTrait class")
    return loaded
