"""Tensor tests drive real proc meshes; an unhandled failure is recorded, never fatal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

from monarch.actor import ProcMesh, this_host
from monarch.core.testing import Failures

sys.path.insert(0, str(Path(__file__).resolve().parent))

import programs

# The workers cannot import this folder's modules: its functions travel by value.
cloudpickle.register_pickle_by_value(programs)


@pytest.fixture(autouse=True)
def _recorded(unhandled_failures: Failures) -> None:
    """Every test records the failures that reach the client unhandled (monarch.core.testing)."""


@pytest.fixture(scope="session")
def procs() -> Iterator[ProcMesh]:
    """Two procs, shared by the session (procs that import torch take seconds to start)."""
    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=60)


@pytest.fixture(scope="session")
def grid() -> Iterator[ProcMesh]:
    """Four procs as a 2x2 mesh, for collectives over one dimension of two."""
    mesh = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    yield mesh
    mesh.stop().get(timeout=60)
