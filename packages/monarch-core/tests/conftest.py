"""Core tests run with a recording fault hook (monarch.core.testing): an unhandled failure
must not end pytest."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from monarch.core.testing import Failures

# Test helpers shared by several files (hostkit.py) are imported by name.
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _recorded(unhandled_failures: Failures) -> None:
    """Every test records the failures that reach the client unhandled (the plugin's
    ``unhandled_failures``: one hook for the session, a fresh list per test)."""
