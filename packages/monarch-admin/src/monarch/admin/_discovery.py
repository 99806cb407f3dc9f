"""How ``monarch top``, ``dashboard`` and ``query`` find a job's admin server on this machine.

Each server writes, beside its token file (``_auth``), a record ``<port>.json`` (mode 0600):
the process that serves, its port, and the saved job it serves (the real path of the
``.monarch/.../state.pkl`` its client attached through, ``null`` for a script without
one). A client that is killed cannot remove them: a record whose process is gone, or
whose port no longer listens, is stale, and is removed (with its token file) whenever
servers are looked up, so no tool hands out a dead link.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from monarch.core.lowlevel import process_alive

from ._auth import token_folder

CONTEXT_JOB: Final = Path(".monarch") / "job_state.pkl"
"""Where the active ``monarch context``'s job is saved (monarch-jobs' default path)."""


@dataclass(frozen=True)
class ServerRecord:
    """One admin server of this user on this machine."""

    host: str
    port: int
    pid: int
    job: str | None
    started: float

    @property
    def addr(self) -> str:
        """``HOST:PORT`` to reach it from here (a wildcard address: loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


def record_file(port: int) -> Path:
    return token_folder() / f"{port}.json"


def write_record(host: str, port: int, job: str | None) -> Path:
    """Say that this process serves ``host:port`` (for the saved job ``job``)."""
    folder = token_folder()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = record_file(port)
    record = {"host": host, "port": port, "pid": os.getpid(), "job": job, "started": time.time()}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(record, file)
    return path


def remove_record(port: int) -> None:
    """Remove the record of ``port`` if this process wrote it."""
    path = record_file(port)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def live_servers() -> list[ServerRecord]:
    """This user's admin servers that still listen here, oldest first; the files of those
    that are gone (a killed client) are removed on the way."""
    try:
        names = {p.stem for p in token_folder().iterdir() if p.suffix in (".json", ".token")}
    except OSError:
        return []
    found = []
    for stem in sorted(n for n in names if n.isdigit()):
        port = int(stem)
        record = _read(port)
        if record is None:  # a token file of a server that wrote no record (an older version)
            if _listens("127.0.0.1", port):
                started = _mtime(token_folder() / f"{stem}.token")
                found.append(ServerRecord("127.0.0.1", port, 0, None, started))
        elif process_alive(record.pid) and _listens(*record.addr.rsplit(":", 1)):
            found.append(record)
        else:
            for suffix in (".json", ".token"):
                (token_folder() / f"{stem}{suffix}").unlink(missing_ok=True)
    return sorted(found, key=lambda r: r.started)


def context_job() -> str | None:
    """The real path of the job the active ``monarch context`` selects in this folder."""
    if not (CONTEXT_JOB.exists() or CONTEXT_JOB.is_symlink()):
        return None
    return os.path.realpath(CONTEXT_JOB)


def choose(servers: list[ServerRecord], job: str | None) -> tuple[ServerRecord | None, str]:
    """The server to talk to and, when the choice needs saying, a sentence why: the one
    serving ``job`` (the context's), else the newest."""
    if not servers:
        return None, ""
    serving = [s for s in servers if job is not None and s.job == job]
    if serving:
        return serving[-1], ""
    newest = servers[-1]
    if job is not None:
        return newest, (
            f"no admin server serves the job saved at {job}; using the newest one here, "
            f"{newest.addr} (--addr picks another)"
        )
    if len(servers) > 1:
        others = ", ".join(s.addr for s in servers[:-1])
        return newest, f"using the newest admin server, {newest.addr} (others: {others})"
    return newest, ""


def _read(port: int) -> ServerRecord | None:
    try:
        data = json.loads(record_file(port).read_text())
        return ServerRecord(
            str(data["host"]),
            int(data["port"]),
            int(data["pid"]),
            data["job"],
            float(data["started"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _listens(host: str, port: int | str) -> bool:
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
            return True
    except OSError:
        return False
