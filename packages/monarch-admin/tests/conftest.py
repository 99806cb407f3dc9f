"""monarch-admin's tests: a real job (``admin_job.py``) per test that needs one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from adminkit import Job


@pytest.fixture
def job() -> Iterator[Job]:
    running = Job()
    try:
        yield running
    finally:
        running.close()
