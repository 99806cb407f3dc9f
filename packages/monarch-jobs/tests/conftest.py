"""monarch-jobs tests: helpers shared by several files (jobkit.py) are imported by name, and
the tests that drive meshes in pytest's own process do so with a recording fault hook."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import monarch.actor
from monarch.actor import MeshFailure

sys.path.insert(0, str(Path(__file__).resolve().parent))

failures: list[MeshFailure] = []
"""Failures no test handled (printed at the end of the session)."""


@pytest.fixture(scope="module", autouse=True)
def _record_unhandled_failures() -> Iterator[None]:
    """Never the default hook in pytest's process: it ends the client (SIGINT), which would
    end the session halfway and leave a test's workers running. Per module, and put back
    after it: a session-wide hook would replace the one monarch-core's tests record with
    when both run in one process (an xdist worker), as it did."""
    default = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = failures.append
    try:
        yield
    finally:
        monarch.actor.unhandled_fault_hook = default
        for failure in failures:
            print(f"unhandled during the module: {failure}", file=sys.stderr)
        failures.clear()
