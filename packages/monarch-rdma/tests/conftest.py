"""RDMA tests run with a recording fault hook (monarch.core.testing): a proc killed on purpose
must not end pytest, and a test waits for its failure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from monarch.core.testing import Failures

# Helpers shared by test files are imported by name (importlib mode puts no test dir on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _recorded(unhandled_failures: Failures) -> None:
    """Every test records the failures that reach the client unhandled."""
