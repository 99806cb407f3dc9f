"""``monarch.job.shell``: an interactive shell on one host over a PTY, driven as a user's
terminal would (a real pseudo-terminal, or pipes), and ``monarch shell`` on a saved job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jobkit import Terminal

from monarch.core.testing import wait_until
from monarch.job import ProcessJob, shell

SCRIPT = Path(__file__).resolve().parent / "shell_script.py"


def test_terminal_data_goes_both_ways_and_the_exit_status_comes_back(tmp_path: Path) -> None:
    term = Terminal([sys.executable, str(SCRIPT), "--env", "FOO=bar", "--workdir", str(tmp_path)])
    try:
        term.until(b"# ")  # the remote bash's prompt
        term.type(b"echo $((6*7))-$FOO; tty; pwd; stty size\r")
        seen = term.until(b"42-bar")
        term.until(b"/dev/pts/")  # the shell's own terminal, not a pipe
        term.until(str(tmp_path).encode())
        assert seen
        term.until(b"30 100")  # the client's window size
        # A short prompt first: with the working directory in it (pytest's tmp_path under
        # xdist) the next line reached the 100th column, and readline redrew it there (CI
        # saw "got-$x" then cursor moves, not "got-$x\r\n"); and only the typed text is
        # waited for, not how readline ends the line.
        term.type(b"cd /\r")
        term.until(b":/# ")
        # A foreground read of keys as they are typed, once `read` prints its prompt ("r43> ",
        # which the typed line does not hold): keys typed while readline still held the terminal
        # raw (CI) sat in the queue as "abc\r", no newline, and `read` waited for one forever.
        term.type(b"read -p r$((6*7+1))'> ' x; echo got-$x\r")
        term.until(b"r43> ")
        term.type(b"abc\r")
        term.until(b"got-abc")
        term.type(b"exit 7\r")
        assert term.proc.wait(60) == 7
    finally:
        term.close()


def test_end_of_input_stops_the_foreground_process() -> None:
    marker = f"{os.getpid()}.25"
    client = subprocess.Popen(
        [sys.executable, str(SCRIPT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert client.stdin is not None
        client.stdin.write(f"exec sleep {marker}\n".encode())
        client.stdin.flush()

        def sleeping() -> bool:
            found = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True)
            return found.returncode == 0

        wait_until(sleeping, 60, "the remote sleep runs")
        client.stdin.close()  # the end of the terminal: a hang-up
        assert client.wait(60) == 128 + 1  # SIGHUP
        wait_until(lambda: not sleeping(), 30, "the sleep ended with its terminal")
    finally:
        if client.poll() is None:
            client.kill()
        client.wait(30)


def test_a_failing_terminal_copy_is_reported() -> None:
    read_end, write_end = os.pipe()
    client = subprocess.Popen(
        [sys.executable, str(SCRIPT)],
        stdin=subprocess.PIPE,
        stdout=write_end,
        stderr=subprocess.PIPE,
    )
    os.close(write_end)
    try:
        assert client.stdin is not None
        client.stdin.write(b"echo first\n")
        client.stdin.flush()
        seen = b""
        while b"first" not in seen:
            chunk = os.read(read_end, 65536)
            assert chunk, "the client's output ended early"
            seen += chunk
        os.close(read_end)  # the terminal goes away: writing to it fails
        read_end = -1
        client.stdin.write(b"yes | head -c 10000000\n")
        client.stdin.flush()
        _, err = client.communicate(timeout=60)
        assert client.returncode == 3
        assert b"error: BrokenPipeError" in err
    finally:
        if read_end >= 0:
            os.close(read_end)
        if client.poll() is None:
            client.kill()
            client.communicate(timeout=30)


def test_it_is_refused_on_a_mesh_of_several_hosts() -> None:
    job = ProcessJob({"hosts": 2})
    try:
        hosts = job.state(cached_path=None).hosts
        with pytest.raises(ValueError, match="singleton HostMesh"):
            shell(hosts)
    finally:
        job.kill()
