"""The examples run unchanged, as a new user would run them (each in a fresh process)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            "getting_started.py",
            [
                "== adverbs",
                "call_one  ->",
                "caught ActorError",
                "caught SupervisionError",  # the whole error, not cut mid-sentence:
                "and all its descendants have failed:\n    the process this actor was running on",
                "stopped",
            ],
        ),
        (
            "supervision.py",
            ["caught SupervisionError", "client fault hook", "(restarts: 1)"],
        ),
        ("transport_demo.py", ["unix://@", "tcp://127.0.0.1:", "tls://127.0.0.1:", "wrong secret"]),
        ("parameter_server.py", ["final weights match the single-process run: True"]),
        (
            "observability.py",
            [
                "ValueError: rank 3 diverged at step 0",
                "its span is in the client's trace",
                ": True",
                "similar log lines]",
                "'trainers[3]': 1",
                "== stopped",
            ],
        ),
        (
            "pods_ddp.py",
            [
                *(f"[{r}] rank {r} of 4: weights equal on every rank: True" for r in range(4)),
                "every rank ran the script: True",
                "pods exited: [0, 0]",
            ],
        ),
        (
            "ddp_actors.py",
            [
                "rank 1: pid",
                "step 4: losses",
                "weights equal on every rank: True",
                "final weights match the single-process run: True",
            ],
        ),
    ],
)
def test_example_runs(script: str, expected: list[str]) -> None:
    done = subprocess.run(
        # faulthandler: a crash (seen once: parameter_server.py ended by SIGSEGV in a loaded
        # CI run) leaves the Python stacks of every thread on stderr
        [sys.executable, "-X", "faulthandler", str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-3000:])
    for text in expected:
        assert text in done.stdout, (text, done.stdout[-3000:])


def run_readme_snippet(marker: str) -> str:
    """The README's code between ``<!-- marker -->`` and ``<!-- /marker -->``, run as a new
    user runs it pasted into a script; its stdout."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    snippet = rf"<!-- {marker} -->\n```python\n(.*?)```\n<!-- /{marker} -->"
    found = re.search(snippet, readme, re.S)
    assert found is not None, f"the README's {marker} snippet is gone"
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", found[1]],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-3000:])
    return done.stdout


def test_the_readmes_first_snippet_prints_what_each_trainer_did() -> None:
    """A newcomer who pastes the README's first code into a script sees that it worked."""
    out = run_readme_snippet("first")
    lines = [line for line in out.splitlines() if line.startswith("trainer ")]
    assert lines == [f"trainer {rank} ran step 0" for rank in range(8)], out[-3000:]


def test_the_readmes_observability_snippet_runs() -> None:
    """The README's "Seeing what a job does" code, as a new user copies it into a script."""
    out = run_readme_snippet("observability")
    assert re.search(r"\[8 similar log lines\]\S* \[\d\] step 1 loss 0.25", out), out[-3000:]
    assert "{'rows': [{'endpoint': 'Trainer.step', 'calls': 8}]}" in out, out[-3000:]


def test_the_transport_demo_needs_no_test_tool() -> None:
    """Run as from a user's install: trustme (a test dependency) is not there."""
    code = (
        "import runpy, sys\n"
        "sys.modules['trustme'] = None  # as if not installed\n"
        f"runpy.run_path({str(EXAMPLES / 'transport_demo.py')!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tls://127.0.0.1:" in done.stdout and "wrong secret" in done.stdout


def test_the_transport_demos_docstring_names_a_command_that_exists() -> None:
    hatch = tomllib.loads((EXAMPLES.parent / "hatch.toml").read_text())
    scripts = hatch["envs"]["default"]["scripts"]
    doc = (EXAMPLES / "transport_demo.py").read_text().split('"""')[1]
    named = re.findall(r"``hatch run ([\w-]+)``", doc)
    assert named == ["demo-transport"]
    assert "examples/transport_demo.py" in scripts[named[0]][1]
