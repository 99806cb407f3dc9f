"""What the per-call hooks do when little records: with the defaults (no SDK, no tables)
an endpoint's hook computes nothing (not the payload's size, nor the queue's depth); the
rows' ids stay distinct across calls and across forked processes."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from monarch.telemetry._sql import event_id

_DEFAULTS = """
from monarch.telemetry import install
from monarch.telemetry._instrumentation import IDLE, OpenTelemetry

install()

class Payload(list):
    def __iter__(self):
        raise AssertionError("the payload's size was computed")

def waiting():
    raise AssertionError("the queue's depth was asked")

telemetry = OpenTelemetry()
for rank in range(3):
    scope = telemetry.enter(object, "m", "actor", "mesh", rank, "", Payload(), waiting)
    assert scope is IDLE, scope
    scope.close(None)
assert telemetry.outgoing("mesh", "m", "mesh_id", None) == ""
print("idle")
"""


def test_the_defaults_compute_nothing_per_call() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", _DEFAULTS], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["idle"]


@given(st.integers(min_value=2, max_value=2000))
def test_row_ids_are_distinct_63_bit_numbers(n: int) -> None:
    ids = [event_id() for _ in range(n)]
    assert len(set(ids)) == n
    assert all(0 <= i < 2**63 for i in ids)


def test_a_forked_process_draws_other_row_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, b" ".join(str(event_id()).encode() for _ in range(100)))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = {int(i) for i in pipe.read().split()}
    os.waitpid(pid, 0)
    mine = {event_id() for _ in range(100)}
    assert len(child) == 100 and not child & mine
