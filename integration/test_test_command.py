"""The README's test command: one environment, what it installs said first, a switch to skip
the system-level parts, and no daemon of the tests' left running."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from monarch.core.testing import alive

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PACKAGES = ROOT / "tools" / "system-packages.sh"
_spec = importlib.util.spec_from_file_location("suite_daemons", ROOT / "tools" / "suite_daemons.py")
assert _spec is not None and _spec.loader is not None
suite_daemons = importlib.util.module_from_spec(_spec)  # tools/ is no package: loaded by path
_spec.loader.exec_module(suite_daemons)


def test_the_suite_runs_in_the_default_environment() -> None:
    """One environment: no second one installing torch and every member again."""
    hatch = tomllib.loads((ROOT / "hatch.toml").read_text())
    assert "test" not in hatch["envs"]
    steps = hatch["envs"]["default"]["scripts"]["test-all"]
    assert steps[0] == "bash tools/system-packages.sh"
    assert "pytest -n 2 --dist loadfile {args}" in steps
    block = re.search(r"<!-- commands -->\n```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    assert block[1].splitlines()[1].endswith("python3 -m hatch run test-all")
    for path in [ROOT / "README.md", *ROOT.glob("packages/*/README.md"), ROOT / ".ci" / "run"]:
        assert "test:all" not in path.read_text(), path


def test_the_readme_lists_every_system_package_and_why() -> None:
    listed = subprocess.run(
        ["bash", str(SYSTEM_PACKAGES), "--list"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(listed) >= 16
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"<!-- system-packages -->\n(.*?)<!-- /system-packages -->", readme, re.S)
    assert section is not None
    expected = "".join(f"- `{pkg}`:{why}\n" for pkg, why in (x.split(":", 1) for x in listed))
    assert section[1] == expected


def test_the_switch_installs_nothing() -> None:
    env = {**os.environ, "MONARCH_SKIP_SYSTEM_TESTS": "1", "PATH": "/nonexistent"}
    done = subprocess.run(
        ["/bin/bash", str(SYSTEM_PACKAGES)], capture_output=True, text=True, env=env, timeout=30
    )
    # PATH has no dpkg nor apt-get: it returned before looking for either.
    assert done.returncode == 0, done.stderr
    assert "MONARCH_SKIP_SYSTEM_TESTS=1: nothing installed" in done.stderr


def test_the_switch_skips_the_system_tests_saying_why() -> None:
    env = {**os.environ, "MONARCH_SKIP_SYSTEM_TESTS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "packages/monarch-jobs/tests/test_ssh.py"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert re.search(r"SKIPPED \[\d+\] .*MONARCH_SKIP_SYSTEM_TESTS=1: needs", done.stdout)
    assert " passed" not in done.stdout and " failed" not in done.stdout


def daemonize(pidfile: Path) -> int:
    """A process that runs on its own (reparented, as a daemon), its pid in ``pidfile``."""
    subprocess.run(
        ["sh", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}"], check=True, timeout=30
    )
    return int(pidfile.read_text())


def test_only_the_daemons_the_suite_recorded_are_stopped(tmp_path: Path) -> None:
    """Not one running before, nor one another session on this machine started meanwhile:
    only those tools/slurm's scripts recorded as started for this session."""
    others = daemonize(tmp_path / "others.pid")
    ours = daemonize(tmp_path / "ours.pid")
    record = tmp_path / "record"
    record.write_text(f"slurmd {ours}\n")
    try:
        assert suite_daemons.recorded(record) == [("slurmd", ours)]
        assert suite_daemons.stop_recorded(record) == ["slurmd"]
        assert not alive(ours)  # ended (a zombie, where nobody reaps it, has ended too)
        assert alive(others)
        assert suite_daemons.stop_recorded(record) == []  # gone: nothing to stop
    finally:
        os.kill(others, 9)


def test_the_session_names_the_record_for_the_start_scripts() -> None:
    """conftest.py sets it before the tests (and xdist's workers) run."""
    record = os.environ.get(suite_daemons.RECORD_ENV)
    assert record is not None and os.path.isfile(record)
    for script in ("start.sh", "munge.sh"):
        assert "$MONARCH_TEST_DAEMONS" in (ROOT / "tools" / "slurm" / script).read_text()
