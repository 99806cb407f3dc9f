"""The ``pymonarch`` meta-package installs every Monarch wheel, pinned to its own version."""

from __future__ import annotations

from importlib.metadata import distribution, requires, version

from packaging.requirements import Requirement

SIBLINGS = [
    "monarch-transport",
    "monarch-core",
    "monarch-rdma",
    "monarch-tensor",
    "monarch-jobs",
    "monarch-telemetry",
    "monarch-admin",
]


def test_depends_on_every_sibling_pinned() -> None:
    own = version("pymonarch")
    plain = [Requirement(r) for r in requires("pymonarch") or []]
    pinned = {str(r.name): str(r.specifier) for r in plain if r.marker is None}
    assert pinned == dict.fromkeys(SIBLINGS, f"=={own}")
    for name in SIBLINGS:
        assert version(name) == own


def test_extras_forward_to_the_siblings() -> None:
    extras = distribution("pymonarch").metadata.get_all("Provides-Extra") or []
    assert sorted(extras) == ["kubernetes", "otlp", "rdma", "slurm", "sql"]
    forwarded = {
        str(r.marker): f"{r.name}[{','.join(sorted(r.extras))}]"
        for r in map(Requirement, requires("pymonarch") or [])
        if r.marker is not None
    }
    assert forwarded == {
        'extra == "kubernetes"': "monarch-jobs[kubernetes]",
        'extra == "slurm"': "monarch-jobs[slurm]",
        'extra == "rdma"': "monarch-tensor[rdma]",
        'extra == "otlp"': "monarch-telemetry[otlp]",
        'extra == "sql"': "monarch-telemetry[sql]",
    }


def test_ships_no_code() -> None:
    files = distribution("pymonarch").files or []
    assert not [f for f in files if f.suffix == ".py"]
