"""A job's output reads as lines: prints of procs and the client, and log lines, never
interleave mid-line when they all go to one pipe."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import logging
from monarch.actor import Actor, endpoint, this_host

class Printer(Actor):
    @endpoint
    def chatter(self, lines: int) -> None:
        for i in range(lines):
            for _ in range(40):
                print("p" * 10, end="")  # a line made of many writes
            print()

class Logger(Actor):
    @endpoint
    def chatter(self, lines: int) -> None:
        log = logging.getLogger("monarch.test")
        for i in range(lines):
            log.warning("l" * 400)

procs = this_host().spawn_procs(per_host={"gpus": 2})
printers = procs.slice(gpus=0).spawn("printers", Printer)
loggers = procs.slice(gpus=1).spawn("loggers", Logger)
both = [printers.chatter.call(300), loggers.chatter.call(300)]
for _ in range(300):
    print("c" * 50, end="")
    print("c" * 350)
for pending in both:
    pending.get(timeout=120)
procs.stop().get(timeout=60)
"""


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "PYTHONUNBUFFERED"])
def test_prints_and_log_lines_through_one_pipe_stay_whole_lines(unbuffered: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"  # as containers often set it
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    lines = done.stdout.splitlines()
    wanted = {"p" * 400: 300, "c" * 400: 300, "l" * 400: 300}
    counts = {line: lines.count(line) for line in wanted}
    broken = [line[:80] for line in lines if line not in wanted]
    assert counts == wanted, broken[:5]
