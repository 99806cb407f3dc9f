"""monarch.core.testing: what the wheels' tests share around real processes.

The failures that reach the client unhandled (``Failures``: the ``unhandled_failures`` fixture
of monarch-core's pytest plugin, ``monarch._testing``, records them), whether a process is
alive (``process_alive`` of ``monarch.core.lowlevel``, for production code) or stopped, and
waiting on a condition with a deadline. Nothing here imports pytest: the scripts that tests
start as clients use these helpers too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from monarch.core._errors import MeshFailure
from monarch.core._host._pids import process_alive as alive
from monarch.core._host._pids import process_state

__all__ = ["Failures", "alive", "stopped", "wait_until"]


class Failures(list[MeshFailure]):
    """Failures that reached the client unhandled while one test ran, and a way to wait for
    one (they arrive asynchronously, from the runtime's threads)."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = threading.Condition()

    def record(self, failure: MeshFailure) -> None:
        with self._changed:
            self.append(failure)
            self._changed.notify_all()

    @property
    def seen(self) -> list[MeshFailure]:
        """The failures so far, as a plain list."""
        return list(self)

    def wait_for(self, mesh: str, timeout: float = 60.0) -> MeshFailure:
        """The first failure of a mesh whose name starts with ``mesh``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for failure in self:
                    if failure.mesh_name.startswith(mesh):
                        return failure
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no failure of {mesh} within {timeout} s: {list(self)}")
                self._changed.wait(left)


def stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP)?"""
    return process_state(pid) == "T"


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> float:
    """Poll ``condition`` until true; fail after ``timeout`` s. Returns the seconds it took."""
    start = time.monotonic()
    deadline = start + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.01)
    return time.monotonic() - start
