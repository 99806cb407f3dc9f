"""Failures that reach the client unhandled, recorded so a test can wait for one."""

from __future__ import annotations

import threading
import time

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
