"""RDMA tests run with a recording fault hook: a proc killed on purpose must not end pytest."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import monarch.actor
from monarch.actor import MeshFailure


class Failures:
    """Failures that reached the client unhandled, and a way to wait for one."""

    def __init__(self) -> None:
        self.seen: list[MeshFailure] = []
        self._changed = threading.Condition()

    def record(self, failure: MeshFailure) -> None:
        with self._changed:
            self.seen.append(failure)
            self._changed.notify_all()

    def wait_for(self, mesh: str, timeout: float = 60.0) -> MeshFailure:
        """The first failure of a mesh whose name starts with ``mesh``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for failure in self.seen:
                    if failure.mesh_name.startswith(mesh):
                        return failure
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no failure of {mesh} within {timeout} s: {self.seen}")
                self._changed.wait(left)


_failures = Failures()


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_failures() -> Iterator[None]:
    default = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = _failures.record
    yield
    monarch.actor.unhandled_fault_hook = default


@pytest.fixture
def failures() -> Failures:
    return _failures
