"""Log forwarding: procs' output at their spawner, one by one or aggregated, from this host
and from a worker's, the last lines of a crashed proc, and upstream's errors and warning.

Clients run as processes of their own (``log_client.py``): what is checked is what they
print. The grouping of similar lines is checked against a plain Levenshtein (hypothesis).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import secrets
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import cast

import pytest
from hostkit import SECRET_ENV, children, start_worker
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, current_rank, endpoint, this_host
from monarch.config import configured
from monarch.core._mesh._logs import (
    SIMILARITY,
    OutputPlan,
    _far_apart,
    _Window,
    forward_output,
    similar,
)
from monarch.core._runtime import Runtime
from monarch.core._runtime._messages import PortRef

CLIENT = Path(__file__).with_name("log_client.py")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_client(*args: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, str(CLIENT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The client's streams are pipes, not terminals: no colour codes in them.
    assert not ANSI.search(done.stdout), done.stdout[-3000:]
    assert not ANSI.search(done.stderr), done.stderr[-3000:]
    return done.stdout, done.stderr


def forwarded(text: str) -> list[str]:
    """The forwarded lines of ``text`` (``[host name-rank@agent] [rank] line``), bare."""
    return [m.group(1) for m in re.finditer(r"^\[\S+ \S+-\d+@\S+\] \[\d+\] (.*)$", text, re.M)]


def test_lines_are_streamed_with_their_origin_and_the_level_is_set() -> None:
    out, err = run_client("stream")
    # Each line once, forwarded, with where it came from, on its stream (upstream prints
    # the procs' own copy of it first as well: on purpose not here).
    assert sorted(forwarded(out)) == [f"hello from rank {r}" for r in range(3)]
    assert sorted(forwarded(err)) == [f"complaint of rank {r}" for r in range(3)]
    assert out.count("hello from rank") == 3 and err.count("complaint of rank") == 3, out
    assert re.search(r"^\[\S+ procs-2@unix://\S+\] \[2\] hello from rank 2$", out, re.M)
    assert "CLIENT: root level {10}" in out


def test_alike_lines_of_64_ranks_are_one_aggregated_line() -> None:
    out, _ = run_client("aggregate")
    blocks = re.findall(r">>> Aggregated Logs \(.*?\) >>>\n(.*?)<<< Aggregated Logs", out, re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    said = [line for line in lines if line.endswith("every rank says this")]
    assert len(said) == 1 and said[0].startswith("[64 similar log lines]"), lines
    hello = [line for line in lines if "hello from rank" in line]
    assert len(hello) == 1 and hello[0].startswith("[64 similar log lines]"), lines
    assert out.count("every rank says this") == 1, out  # not 64 raw lines before the block
    assert "CLIENT: stopped" in out  # the window open at the stop was printed, not lost


def test_a_crashed_procs_last_lines_and_traceback_reach_the_client() -> None:
    out, err = run_client("crash")
    assert "last words" in forwarded(out)
    traceback = forwarded(err)
    assert any("Fatal Python error: Segmentation fault" in line for line in traceback), err
    assert any("in crash" in line for line in traceback), err
    assert "CLIENT: crash raised SupervisionError" in out


def test_without_forwarding_at_spawn_streaming_warns_and_bad_options_raise() -> None:
    out, err = run_client("off")
    assert "CLIENT: RuntimeError cannot set aggregate window without streaming to client" in out
    assert "CLIENT: TypeError level is a logging level" in out
    assert "UserWarning: logging_option(stream_to_client=True) has no effect" in err
    assert "enable_log_forwarding=True" in err
    assert forwarded(out) == []


def test_file_capture_and_the_tail_of_a_proc_that_failed_to_start(tmp_path: Path) -> None:
    env = {**os.environ, "MONARCH_INTERNAL_LOG": str(tmp_path / "internal.log")}
    out, err = run_client("capture", env=env)
    # Upstream's files: one pair for the host's procs, each line with its rank; only with
    # force_file_log (as upstream's outside Meta's clusters, where it detects a "local" run).
    (stdout_file,) = tmp_path.glob("monarch_log_*.stdout")
    (stderr_file,) = tmp_path.glob("monarch_log_*.stderr")
    assert sorted(stdout_file.read_text().splitlines()) == [
        "[0] captured from rank 0",
        "[1] captured from rank 1",
    ]
    captured = stderr_file.read_text().splitlines()
    assert "[0] complaint of rank 0" in captured and "[1] complaint of rank 1" in captured
    assert "unforced" not in stdout_file.read_text()
    assert "[0] boot line 9" in captured  # the procs that failed to start, too
    # The output still reaches the client's own streams, as without capture.
    assert "captured from rank 1\n" in out and "complaint of rank 0\n" in err
    # tail_log_lines: the last lines of stderr (blank ones left out) name why it failed.
    assert "CLIENT: tail 0: RuntimeError('proc 0 (pid " in out
    assert "before it was ready')" in out
    tail = re.search(r"CLIENT: tail 3: (.*)", out)
    assert tail is not None, out
    assert tail[1].endswith(
        "before it was ready; the last lines of its stderr:\\n    boot line 7\\n"
        "    boot line 8\\n    boot line 9')"
    ), tail[1]


def test_a_procs_pipes_are_closed_once_not_again_when_its_object_is_collected() -> None:
    # The agent's readers closed the pipes' numbers and left the child's file objects to
    # close them again when collected: by then the numbers of a later proc's pipes, whose
    # output was lost (a tail that missed lines, seen under load).
    script = "import sys; print('out'); print('last words', file=sys.stderr)"
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None and child.stderr is not None
    numbers = {child.stdout.fileno(), child.stderr.fileno()}
    plan = OutputPlan(forward=False, capture=False, tail=3)
    output = forward_output(cast(Runtime, None), child, 0, cast(PortRef, None), plan)
    child.wait()
    ended = threading.Event()
    output.after_end(ended.set)
    assert ended.wait(10)
    assert output.tail() == ("last words",)
    assert child.stdout.closed and child.stderr.closed  # read to their end, and closed
    later: list[int] = []  # files opened since, until they hold the freed numbers
    try:
        while not numbers <= set(later) and len(later) < 256:
            later.append(os.open(os.devnull, os.O_RDONLY))
        assert numbers <= set(later)
        del child
        gc.collect()
        for fd in later:
            os.fstat(fd)  # EBADF where a collected object closed it
    finally:
        for fd in later:
            with contextlib.suppress(OSError):
                os.close(fd)


class Speaker(Actor):
    @endpoint
    def say(self, text: str) -> int:
        print(f"{text} {current_rank().rank}", flush=True)
        return os.getpid()


def test_the_agent_reads_every_procs_output_and_exit_on_one_thread() -> None:
    # A thread per pipe and per proc made three per proc (3,072 at 1,024 procs).
    before = threading.active_count()
    with configured(enable_log_forwarding=True, tail_log_lines=2):
        procs = this_host().spawn_procs(per_host={"gpus": 16})
        try:
            pids = procs.spawn("speaker", Speaker).say.call("hello").get(timeout=60).values()
            during = threading.active_count()
            names = [thread.name for thread in threading.enumerate()]
        finally:
            procs.stop().get(timeout=60)
    assert len(set(pids)) == 16
    assert during - before < 8, names  # not one per proc
    assert not [name for name in names if name.startswith(("monarch-output", "monarch-wait"))]


@pytest.fixture
def secret_env() -> dict[str, str]:
    return {**os.environ, SECRET_ENV: secrets.token_hex(32)}


def test_lines_of_procs_on_another_host_reach_the_client(secret_env: dict[str, str]) -> None:
    with children() as start:
        worker, address = start_worker(start, secret_env, "tcp://127.0.0.1:0")
        out, err = run_client("remote", address, env=secret_env)
        assert sorted(forwarded(out)) == ["far from rank 0", "far from rank 1"]
        assert sorted(forwarded(err)) == ["complaint of rank 0", "complaint of rank 1"]
        assert [line for line in out.splitlines() if line.startswith("far")] == []  # no raw copy
        raw = worker.said()  # the worker's procs wrote there too (its own stderr)
        assert "complaint of rank 0" in raw


def levenshtein(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


lines = st.text(alphabet="ab01 x", max_size=40)


@given(a=lines, b=lines)
def test_similar_is_a_bounded_edit_distance(a: str, b: str) -> None:
    expected = levenshtein(a, b) <= int(SIMILARITY * max(len(a), len(b)))
    assert similar(a, b) is expected
    assert similar(b, a) is expected
    assert similar(a, b, counts=(Counter(a), Counter(b))) is expected  # as a window asks


@given(a=lines, b=lines, most=st.integers(0, 12))
def test_lines_counted_far_apart_are_more_edits_apart_than_the_bound(
    a: str, b: str, most: int
) -> None:
    # The filter before the edit distance only ever skips lines it would not group.
    if _far_apart(Counter(a), Counter(b), most):
        assert levenshtein(a, b) > most


@given(st.lists(st.tuples(st.integers(0, 7), lines), max_size=60))
def test_a_window_counts_every_line_once_in_a_group_it_is_similar_to(
    arrivals: list[tuple[int, str]],
) -> None:
    window = _Window()
    for rank, line in arrivals:
        window.add(rank, line)
    assert sum(group.count for group in window.groups) == len(arrivals)
    firsts = [group.text for group in window.groups]
    for _, line in arrivals:  # each line went to the first group it is similar to
        assert any(similar(first, line) for first in firsts)
    block = ANSI.sub("", window.block())
    assert block.count("similar log lines]") == len(window.groups)
