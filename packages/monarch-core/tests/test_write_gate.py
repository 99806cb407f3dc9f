"""The write gate (``_write_gate``): a drop waits for the writers that hold a loan's gate,
a writer's death lets go of it, and threads of one writer share one hold.

The writers are real processes (and this one, through ``/proc/self/fd``: another open
file description, so its locks conflict with the lender's as another process's do)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time

import pytest

from monarch.core._bulk import _memory_plane as memory_plane
from monarch.core._bulk import _write_gate as write_gate

pytestmark = pytest.mark.skipif(
    not (write_gate.available() and memory_plane.available()), reason="Linux only"
)

TOKEN = 12345

WRITER = """
import ctypes, sys
from monarch.core._bulk import _memory_plane as memory_plane
from monarch.core._bulk import _write_gate as write_gate
pid, gate, loan, address = map(int, sys.argv[1:5])
with write_gate.holding(pid, gate, 12345, loan):
    print("held", flush=True)
    if sys.stdin.readline().strip() == "write":
        byte = ctypes.create_string_buffer(b"W", 1)
        memory_plane.write_range(pid, ctypes.addressof(byte), address, 1)
    print("done", flush=True)
"""


def _writer(gate: write_gate.Gate, loan: int, address: int) -> subprocess.Popen[str]:
    args = [sys.executable, "-c", WRITER, str(os.getpid()), str(gate.fd), str(loan), str(address)]
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    return child


def _join(thread: threading.Thread) -> None:
    thread.join(timeout=60)
    assert not thread.is_alive(), "the drop never finished"


def test_a_drop_waits_for_the_writer_that_holds_the_gate() -> None:
    gate = write_gate.Gate()
    target = ctypes.create_string_buffer(b"-", 1)
    child = _writer(gate, 7, ctypes.addressof(target))
    seen: list[bytes] = []

    def drop() -> None:
        gate.close(7)
        seen.append(target.raw)

    dropping = threading.Thread(target=drop)
    try:
        assert gate.busy(7) and not gate.busy(8)
        dropping.start()
        assert child.stdin is not None
        child.stdin.write("write\n")
        child.stdin.flush()
        _join(dropping)
        assert seen == [b"W"]  # the drop returned only after the write had landed
    finally:
        child.kill()
        child.wait()


def test_a_writer_that_dies_lets_go_of_its_gate() -> None:
    gate = write_gate.Gate()
    child = _writer(gate, 3, 0)
    assert gate.busy(3)
    child.kill()
    child.wait()
    deadline = time.monotonic() + 30
    while gate.busy(3):  # the kernel lets go as it closes the dead process's files
        assert time.monotonic() < deadline, "a dead writer still holds the gate"
        time.sleep(0.01)
    dropping = threading.Thread(target=gate.close, args=(3,))
    dropping.start()
    _join(dropping)


def test_threads_of_one_writer_share_a_hold_until_the_last_lets_go() -> None:
    gate = write_gate.Gate()
    me = os.getpid()
    with write_gate.holding(me, gate.fd, TOKEN, 5):
        with write_gate.holding(me, gate.fd, TOKEN, 5):
            assert gate.busy(5)
        assert gate.busy(5)  # the outer hold still stands
        with write_gate.holding(me, gate.fd, TOKEN, 6):
            assert gate.busy(6)
        assert not gate.busy(6)
    assert not gate.busy(5)
    gate.close(5)  # nobody holds it: returns at once


def test_a_gate_that_cannot_be_opened_is_a_pull_error() -> None:
    from monarch.core import PullError

    with pytest.raises(PullError), write_gate.holding(os.getpid(), 1 << 20, TOKEN, 1):
        pass


def test_a_forked_child_holds_a_gate_of_its_own() -> None:
    """A child forked after the gate file was opened here holds its gates through a file
    of its own: the parent's release does not end the child's hold (one shared open file
    description would share, and so drop, the lock)."""
    gate = write_gate.Gate()
    me = os.getpid()
    with write_gate.holding(me, gate.fd, TOKEN, 8):
        pass  # the gate file is open here now
    held_r, held_w = os.pipe()
    done_r, done_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - its exit status says how it went
        code = 1
        try:
            with write_gate.holding(me, gate.fd, TOKEN, 9):
                os.write(held_w, b"h")
                os.read(done_r, 1)
            code = 0
        finally:
            os._exit(code)
    try:
        assert os.read(held_r, 1) == b"h"
        with write_gate.holding(me, gate.fd, TOKEN, 9):
            pass
        assert gate.busy(9)  # the child's hold stands
    finally:
        os.write(done_w, b"d")
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not gate.busy(9)


def test_a_drop_with_a_deadline_says_so_when_a_writer_holds_on() -> None:
    """A writer stopped mid-write holds the gate: the drop ends at its deadline with
    False (never a hang), and closes once the writer is gone."""
    gate = write_gate.Gate()
    child = _writer(gate, 4, 0)
    try:
        assert not gate.close(4, time.monotonic() + 0.2)
        assert gate.busy(4)
    finally:
        child.kill()
        child.wait()
    assert gate.close(4, time.monotonic() + 60)
