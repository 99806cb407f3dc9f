"""Failures that say what they are: a category (user code, system, infrastructure) and the
first failure of a cascade, in ``MeshFailure.record()`` and as JSON lines in the system
log; read off a real client whose procs are killed and whose actors fail, and off the
report texts themselves (hypothesis: any nesting of them names its innermost failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from monarch.core._mesh._reports import (
    INFRASTRUCTURE,
    USER,
    aborted,
    failed_event,
    failed_report,
    failure_cause,
    process_ended,
    supervise_raised_report,
    unhandled_event,
)

CLIENT = Path(__file__).with_name("failure_records_client.py")


def records(log: Path) -> list[dict[str, Any]]:
    """The supervision records of a system log: the JSON after each line's glog prefix."""
    lines = [line for line in log.read_text().splitlines() if " monarch.supervision:" in line]
    return [json.loads(line.split("] ", 1)[1]) for line in lines]


def test_a_killed_proc_user_code_and_a_cascade_are_told_apart(tmp_path: Path) -> None:
    log = tmp_path / "monarch.log"
    env = {**os.environ, "MONARCH_INTERNAL_LOG": str(log), "MONARCH_FILE_LOG": "info"}
    done = subprocess.run(
        [sys.executable, str(CLIENT)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    found = records(log)
    assert all(r["schema"] == "monarch.supervision/1" for r in found)
    by_mesh = {r["mesh"].rpartition("-")[0]: r for r in found}
    killed = by_mesh["killed"]
    assert (killed["category"], killed["kind"]) == (INFRASTRUCTURE, "killed process")
    assert not killed["propagated"] and killed["root_cause"]["actor"].endswith("Victim killed>")
    assert "Killed(sig=9)" in killed["root_cause"]["reason"]
    user = by_mesh["user"]
    assert (user["category"], user["kind"]) == (USER, "exception in user code")
    assert "user code gave up" in user["root_cause"]["reason"] and not user["propagated"]
    # The cascade: the child failed, its owner did not handle it, the client hears of the
    # owner's failure: the first failure is named, and that it reached here from below.
    parent = by_mesh["parent"]
    assert parent["propagated"] and parent["category"] == USER
    child = "<root>.<__main__.Parent parent>.<__main__.Victim child>"
    assert parent["root_cause"]["actor"] == child
    assert parent["root_cause"] == by_mesh["child"]["root_cause"]  # the owner's proc's line
    assert parent["report"].startswith(f"The actor {child} and all its descendants")


actor_names = st.from_regex(r"<root>\.<[a-z_.]{1,12}\.[A-Z][a-z]{0,8} [a-z]{1,8}>", fullmatch=True)
reasons = st.one_of(
    st.sampled_from(["exited with code 3", "was killed by signal 9", "lost connection"]).map(
        lambda how: process_ended(how)[0]
    ),
    st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), min_size=1).map(
        lambda why: aborted(f'Traceback:\n  File "/home/u/train.py", line 3\nValueError: {why}')
    ),
)


@given(actor_names, reasons, st.lists(actor_names, max_size=4), st.booleans())
def test_any_cascade_names_its_first_failure(
    first: str, reason: str, owners: list[str], raised: bool
) -> None:
    """However many owners fail in turn (unhandled, or their ``__supervise__`` raising),
    the event and the report name the first actor and its reason."""
    event, report = failed_event(first, reason), failed_report(first, reason)
    for owner in owners:
        event = unhandled_event(owner, event)
        if raised:
            report = supervise_raised_report(owner, RuntimeError("in supervise"), report)
    for text in (event, report):
        cause = failure_cause(text)
        assert (cause.actor, cause.reason) == (first, reason.strip())
        assert cause.propagated == bool(owners) or text is report
    expected = INFRASTRUCTURE if reason.startswith("the process") else USER
    assert failure_cause(report).category == expected
