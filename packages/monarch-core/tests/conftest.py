"""Core tests run with a recording fault hook: an unhandled failure must not end pytest."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import monarch.actor
from monarch.actor import MeshFailure

# Test helpers shared by several files (hostkit.py) are imported by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def unhandled_failures(monkeypatch: pytest.MonkeyPatch) -> list[MeshFailure]:
    """Failures that reached the client unhandled during the test (the hook's default
    reports them and interrupts the main thread, as upstream's does)."""
    failures: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", failures.append)
    return failures
