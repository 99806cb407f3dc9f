"""RDMA tests run with a recording fault hook: a proc killed on purpose must not end pytest."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import monarch.actor

# Helpers shared by test files are imported by name (importlib mode puts no test dir on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rdma_faults import Failures

_failures = Failures()


@pytest.fixture(scope="module", autouse=True)
def _record_rdma_failures() -> Iterator[None]:
    """Per module, and put back after it: a session-wide hook would replace the one
    monarch-core's tests record with when both run in one process (an xdist worker)."""
    default = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = _failures.record
    yield
    monarch.actor.unhandled_fault_hook = default


@pytest.fixture
def failures() -> Failures:
    return _failures
