"""monarch.core.testing: what the wheels' tests share around real processes.

The failures that reach the client unhandled (``Failures``: the ``unhandled_failures`` fixture
of monarch-core's pytest plugin, ``monarch._testing``, records them), whether a process is
alive (``process_alive`` of ``monarch.core.lowlevel``, for production code) or stopped, a
process started by a test whose output is read a line at a time with a deadline (``Child``),
and waiting on a condition with a deadline. Nothing here imports pytest: the scripts that tests
start as clients use these helpers too.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from monarch.core._errors import MeshFailure
from monarch.core._host._environ import ROOT_ENV
from monarch.core._host._pids import process_alive as alive
from monarch.core._host._pids import process_state

__all__ = ["ROOT_ENV", "Child", "Failures", "alive", "stopped", "wait_until"]


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


class Child:
    """A process a test starts (a worker, a client script), whose stdout is read a line at a
    time, each read with a deadline; its stderr is kept in a file and quoted when a read
    fails. ``env`` is the whole environment (None: this process's); ``stdin``: the test
    writes lines to it (``send_line``)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        stdin: bool = False,
        cwd: str | Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in kill()
        self.popen = subprocess.Popen(
            self.argv,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
        )
        self.pid = self.popen.pid
        self._buffer = b""

    def said(self) -> str:
        """Everything it wrote to stderr so far."""
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def _explain(self, what: str) -> str:
        return f"{what} from {self.argv[:6]}; stderr:\n{self.said()[-3000:]}"

    def line(self, timeout: float) -> str:
        """The next line of its stdout; AssertionError after ``timeout`` s or at its exit."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            poller = select.poll()  # any descriptor (select refuses those from 1024 up)
            poller.register(fd, select.POLLIN)
            if left <= 0 or not poller.poll(left * 1000):
                raise AssertionError(self._explain(f"no line within {timeout}s"))
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(self._explain(f"exit {self.popen.wait()} before a line"))
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def json(self, timeout: float) -> dict[str, Any]:
        """The next line of its stdout, a JSON object."""
        data: dict[str, Any] = json.loads(self.line(timeout))
        return data

    def send_line(self, text: str = "") -> None:
        """Write one line to its stdin (started with ``stdin=True``)."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(text.encode() + b"\n")
        self.popen.stdin.flush()

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def kill(self) -> None:
        """Kill it if it runs, reap it, and close its stderr file."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        self.stderr.close()
