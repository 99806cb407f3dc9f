"""A running job with an admin server (``admin_job.py``) in a process of its own, and
waiting on conditions about it with deadlines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


class Job:
    def __init__(
        self, timeout: float = 1.0, home: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """``home``: the job's HOME (where its server writes its token file); ``env``: more
        of its environment."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
        if home is not None:
            env["HOME"] = home
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "admin_job.py"), str(timeout)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"the job ended before its admin server started ({code})")
        hello = json.loads(line)
        self.url: str = hello["url"]
        self.addr: str = hello["addr"]
        self.token: str = hello["token"]
        self.secret: str = hello["secret"]

    def command(self, line: str) -> None:
        """Send a command to the job and wait until it has done it."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer == f"ok {line.split()[0]}", answer

    def get(self, path: str, token: str | None = None, method: str = "GET") -> tuple[int, Any]:
        """(status, JSON body) of a request to the admin server."""
        headers = {} if token == "" else {"Authorization": f"Bearer {token or self.token}"}
        request = urllib.request.Request(self.url + path, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, data = response.status, response.read()
                kind = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, data, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        return status, (json.loads(data) if kind.startswith("application/json") else data.decode())

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (status, body)
        return body

    def snapshot(self) -> Any:
        return self.json("/v1/snapshot")

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.command("quit")
                self.process.wait(timeout=30)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def wait_for(what: Callable[[], T | None], timeout: float = 30.0, message: str = "") -> T:
    """``what()``'s first true value, asked again until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message or what}")
        time.sleep(0.05)


def actors(snap: Any) -> list[Any]:
    return [a for host in snap["hosts"] for p in host["procs"] for a in p["actors"]]


def procs(snap: Any) -> list[Any]:
    return [p for host in snap["hosts"] for p in host["procs"]]


def actor(snap: Any, mesh: str, rank: int) -> Any:
    return next(a for a in actors(snap) if a["mesh"] == mesh and a["rank"] == rank)
