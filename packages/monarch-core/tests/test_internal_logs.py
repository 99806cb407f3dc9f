"""The runtime's internal log file, apart from the user's logs (probed against upstream 0.7.0:
the client prints "Monarch internal logs are being written to /tmp/$USER/monarch_log.log;
execution id USER_Mon-DD_HH:MM_NNN" on stderr when it first spawns, and every process of the
job appends to that file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch.core._runtime._internal_logs import log_path

SCRIPT = textwrap.dedent(
    """
    import logging, os, sys
    from monarch.actor import Actor, endpoint, this_host

    if sys.argv[1] == "configured":
        logging.basicConfig(level=logging.WARNING, format="USER %(name)s %(message)s")
    if sys.argv[1] == "errors-only":  # after the import: the zygote started without it
        os.environ["MONARCH_FILE_LOG"] = "ERROR"

    class Hello(Actor):
        @endpoint
        def hi(self) -> int:
            logging.getLogger("monarch.core").error("an error in proc %d", os.getpid())
            return 1

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    assert procs.spawn("hello", Hello).hi.call().get().item(gpus=1) == 1
    logging.getLogger("monarch.core").warning("a runtime warning")
    logging.getLogger("monarch.core").info("a runtime info line")
    logging.getLogger("user").info("a user info line")
    procs.stop().get()
    """
)


Ran = tuple[subprocess.CompletedProcess[str], str]


def run(tmp_path: Path, mode: str = "plain", **env: str) -> Ran:
    log = tmp_path / "internal.log"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        env={**os.environ, "MONARCH_INTERNAL_LOG": str(log), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, log.read_text() if log.exists() else ""


def test_the_job_writes_one_file_and_the_client_says_where(tmp_path: Path) -> None:
    done, text = run(tmp_path)
    banner = re.search(
        r"Monarch internal logs are being written to (\S+); execution id (\S+)\n", done.stderr
    )
    assert banner is not None, done.stderr
    assert banner[1] == str(tmp_path / "internal.log")
    execution = banner[2]
    assert re.fullmatch(r"\w+_[A-Z][a-z]{2}-\d\d_\d\d:\d\d_\d{3}", execution)
    lines = text.splitlines()
    # The client and both procs, each line with the execution id, its role and glog's shape.
    assert any(f"[{execution} client]I" in line and "listening at" in line for line in lines)
    for rank in (0, 1):
        assert any(f"[{execution} proc {rank}]I" in line for line in lines), text
    assert sum("started" in line for line in lines) == 2
    assert sum("exited with code 0" in line for line in lines) == 2
    assert re.search(r"\]W\d{4} [\d:.]+ \d+ monarch\.core:\d+\] a runtime warning", text)
    # Apart: the user's records are not in it; the runtime's info is not on stderr.
    assert "a user info line" not in text
    assert "a runtime info line" in text and "a runtime info line" not in done.stderr
    # A warning still reaches stderr as Python's last resort prints it (no handler set).
    assert "\na runtime warning\n" in "\n" + done.stderr


def test_a_user_who_configured_logging_gets_the_warnings_once(tmp_path: Path) -> None:
    done, text = run(tmp_path, "configured")
    assert done.stderr.count("a runtime warning") == 1
    assert "USER monarch.core a runtime warning" in done.stderr
    assert "a runtime info line" not in done.stderr and "a runtime info line" in text


def test_levels_from_the_environment(tmp_path: Path) -> None:
    done, text = run(tmp_path, MONARCH_FILE_LOG="ERROR", MONARCH_STDERR_LOG="info")
    assert "a runtime warning" not in text and "listening at" not in text
    assert "a runtime info line" in done.stderr  # printed from INFO now
    done, text = run(tmp_path, MONARCH_FILE_LOG="loud")
    assert "MONARCH_FILE_LOG='loud' is not a log level" in done.stderr


def test_procs_write_under_their_own_names_at_the_levels_they_were_given(
    tmp_path: Path,
) -> None:
    """A proc takes its zygote's handler and file (the zygote installs them before it
    forks) only when it would choose the same: levels set after the zygote started (by
    the script, after its import) are the procs', which install their own."""
    (tmp_path / "same").mkdir()
    (tmp_path / "late").mkdir()
    _, text = run(tmp_path / "same")
    assert re.search(r" proc 1\]E.* an error in proc \d+", text), text
    _, text = run(tmp_path / "late", "errors-only")
    lines = text.splitlines()
    for rank in (0, 1):
        assert any(f" proc {rank}]E" in line and "an error in proc" in line for line in lines)
        assert not any(f" proc {rank}]I" in line for line in lines), text  # the zygote's INFO


def test_off_writes_no_file_and_no_banner(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "plain"],
        env={**os.environ, "MONARCH_INTERNAL_LOG": "off"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "internal logs are being written" not in done.stderr
    assert "a runtime warning" in done.stderr


def test_the_log_folder_follows_the_user_names_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user's name is looked up once per uid and set of names (a zygote's procs reuse
    its answer), yet a proc whose environment names another user writes under that name,
    as ``getpass.getuser`` would have it."""
    monkeypatch.delenv("MONARCH_INTERNAL_LOG", raising=False)
    monkeypatch.setenv("LOGNAME", "alice")
    assert log_path() == Path("/tmp/alice/monarch_log.log")
    monkeypatch.setenv("LOGNAME", "bob")
    assert log_path() == Path("/tmp/bob/monarch_log.log")
    monkeypatch.setenv("LOGNAME", "alice")
    assert log_path() == Path("/tmp/alice/monarch_log.log")
