"""Core tests run with a recording fault hook: an unhandled failure must not end pytest."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import monarch.actor
from monarch.actor import MeshFailure

# Test helpers shared by several files (hostkit.py) are imported by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))


_sink: list[list[MeshFailure]] = [[]]
"""Where the recording hook puts failures: the running test's list."""


def _record(failure: MeshFailure) -> None:
    _sink[0].append(failure)


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_failures() -> Iterator[None]:
    """For the whole session, never the default hook: failures arrive asynchronously, and
    one from a test that just ended must not interrupt the next (or the xdist worker)."""
    default = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = _record
    yield
    monarch.actor.unhandled_fault_hook = default


@pytest.fixture(autouse=True)
def unhandled_failures() -> list[MeshFailure]:
    """Failures that reached the client unhandled while this test ran (a late one from
    the test before may land here too: assert on your own meshes' names)."""
    failures: list[MeshFailure] = []
    _sink[0] = failures
    return failures
