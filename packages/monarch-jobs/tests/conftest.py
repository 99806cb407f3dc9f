"""monarch-jobs tests: helpers shared by several files (jobkit.py) are imported by name, and
the tests that drive meshes in pytest's own process do so with a recording fault hook."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch.core.testing import Failures

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(autouse=True)
def _recorded(unhandled_failures: Failures) -> Iterator[None]:
    """Never the default hook in pytest's process: it ends the client (SIGINT), which would
    end the session halfway and leave a test's workers running (monarch.core.testing)."""
    yield
    for failure in unhandled_failures:
        print(f"unhandled during the test: {failure}", file=sys.stderr)
