"""``monarch.job.shell``: an interactive shell on one host over a PTY, driven as a user's
terminal would (a real pseudo-terminal, or pipes), and ``monarch shell`` on a saved job."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from jobkit import wait_until

from monarch.job import ProcessJob, shell

SCRIPT = Path(__file__).resolve().parent / "shell_script.py"


class Terminal:
    """A process on a pseudo-terminal of its own, read with deadlines."""

    def __init__(self, argv: list[str], cwd: Path | None = None) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, start_new_session=True
        )
        os.close(slave)
        self.seen = b""

    def until(self, marker: bytes, timeout: float = 60) -> bytes:
        deadline = time.monotonic() + timeout
        while marker not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not within {timeout}s: {marker!r} in {self.seen[-2000:]!r}")
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the process ended and closed the terminal
                    raise AssertionError(f"{marker!r} never came: {self.seen[-2000:]!r}") from None
        return self.seen

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        os.close(self.master)


def test_terminal_data_goes_both_ways_and_the_exit_status_comes_back(tmp_path: Path) -> None:
    term = Terminal(
        [sys.executable, str(SCRIPT), "--env", "FOO=bar", "--workdir", str(tmp_path)]
    )
    try:
        term.until(b"# ")  # the remote bash's prompt
        term.type(b"echo $((6*7))-$FOO; tty; pwd; stty size\r")
        seen = term.until(b"42-bar")
        term.until(b"/dev/pts/")  # the shell's own terminal, not a pipe
        term.until(str(tmp_path).encode())
        assert seen
        term.until(b"30 100")  # the client's window size
        term.type(b"read x; echo got-$x\r")  # a foreground read of keys as they are typed
        term.until(b"got-$x\r\n")
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
