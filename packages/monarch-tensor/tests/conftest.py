"""Tensor tests drive real proc meshes; an unhandled failure is recorded, never fatal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest

import monarch.actor
from monarch.actor import MeshFailure, ProcMesh, this_host

sys.path.insert(0, str(Path(__file__).resolve().parent))

import programs

# The workers cannot import this folder's modules: its functions travel by value.
cloudpickle.register_pickle_by_value(programs)

_sink: list[list[MeshFailure]] = [[]]


def _record(failure: MeshFailure) -> None:
    _sink[0].append(failure)


@pytest.fixture(scope="module", autouse=True)
def _record_tensor_failures() -> Iterator[None]:
    """Per module, and put back after it: a session-wide hook would replace the one
    another package's tests record with when both run in one process (an xdist worker)."""
    default = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = _record
    yield
    monarch.actor.unhandled_fault_hook = default


@pytest.fixture(autouse=True)
def unhandled_failures() -> list[MeshFailure]:
    failures: list[MeshFailure] = []
    _sink[0] = failures
    return failures


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
