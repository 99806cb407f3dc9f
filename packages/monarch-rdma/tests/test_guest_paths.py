"""The soft-RoCE VM tests skip, saying why, when the guest cannot see the test's Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from guest_paths import GUEST_OWN, hidden_from_guest


def test_an_interpreter_under_tmp_is_hidden_from_the_guest(tmp_path: Path) -> None:
    assert str(tmp_path).startswith(GUEST_OWN)  # pytest's temporary directory: under /tmp
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    hidden = hidden_from_guest(str(venv / "bin" / "python"))
    assert str(venv / "bin" / "python") in hidden
    assert any(path.startswith(str(venv / "lib")) for path in hidden)


def test_the_system_interpreter_is_visible_to_the_guest() -> None:
    assert hidden_from_guest("/usr/bin/python3") == []
