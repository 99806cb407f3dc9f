"""Shared by every test of the repository (packages/*/tests and integration/)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

SKIP_SYSTEM = "MONARCH_SKIP_SYSTEM_TESTS"
"""Set to 1: tools/system-packages.sh installs nothing and the tests marked ``system``
(they need its Debian packages, or start system daemons) skip, saying so."""


def _suite_daemons() -> ModuleType:
    """tools/suite_daemons.py (tools/ is no package: loaded by path)."""
    path = Path(__file__).parent / "tools" / "suite_daemons.py"
    spec = importlib.util.spec_from_file_location("suite_daemons", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_daemon_record = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Name the file where tools/slurm's scripts record the daemons they start (the
    session's controller; xdist workers inherit the environment)."""
    if hasattr(config, "workerinput"):
        return
    daemons = _suite_daemons()
    fd, name = tempfile.mkstemp(prefix="monarch-test-daemons-")
    os.close(fd)
    config.stash[_daemon_record] = Path(name)
    os.environ[daemons.RECORD_ENV] = name


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the system daemons this session started (tools/suite_daemons.py)."""
    record = config.stash.get(_daemon_record, None)
    if record is None:
        return
    stopped = _suite_daemons().stop_recorded(record)
    record.unlink(missing_ok=True)
    if stopped:
        sys.stderr.write(f"stopped the daemons the tests started: {', '.join(stopped)}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SKIP_SYSTEM) != "1":
        return
    skip = pytest.mark.skip(
        reason=f"{SKIP_SYSTEM}=1: needs tools/system-packages.sh's Debian packages or "
        "starts system daemons"
    )
    for item in items:
        if item.get_closest_marker("system") is not None:
            item.add_marker(skip)


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run every ``@pytest.mark.anyio`` test on both asyncio and trio."""
    return str(request.param)


# -- two hosts in network namespaces (as shared/infra/netns) -------------------------------------


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str]]:
    """Namespaces at 10.0.0.1 and 10.0.0.2, joined by a veth pair; what runs in them is
    killed when the test ends."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"th{os.getpid() % 100000}"
    a, b = f"{tag}a", f"{tag}b"
    made: list[str] = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", f"{tag}x", "type", "veth", "peer", "name", f"{tag}y")
        for ns, end, addr in ((a, f"{tag}x", "10.0.0.1/24"), (b, f"{tag}y", "10.0.0.2/24")):
            _ip("link", "set", end, "netns", ns)
            _ip("-n", ns, "addr", "add", addr, "dev", end)
            _ip("-n", ns, "link", "set", end, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield a, b
    finally:
        for ns in made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def netns_worker() -> Iterator[Callable[[str, str, dict[str, str]], str]]:
    """``start(ns, host, env)``: a ``monarch worker`` listening on ``tcp://HOST:0`` in
    namespace ``ns``; its address. Every one started is killed when the test ends."""
    workers: list[subprocess.Popen[str]] = []

    def start(ns: str, host: str, env: dict[str, str]) -> str:
        worker = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "monarch.core.worker",
             "--listen", f"tcp://{host}:0"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        workers.append(worker)
        assert worker.stdout is not None
        address = worker.stdout.readline().strip()  # the worker prints its address first
        assert address.startswith(f"tcp://{host}:"), (address, worker.stderr)
        return address

    try:
        yield start
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(30)
            for stream in (worker.stdout, worker.stderr):  # else a collection warns later
                if stream is not None:
                    stream.close()
