"""``monarch context`` (upstream's): jobs saved side by side in ``.monarch/<name>/``,
``.monarch/job_state.pkl`` a link to the active one's. Driven as a user runs it: the
``monarch`` command in a folder of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def monarch(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monarch.core", *argv],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_contexts_are_created_switched_listed_and_removed(tmp_path: Path) -> None:
    link = tmp_path / ".monarch" / "job_state.pkl"
    # a job saved before any context: adopted as the context "default" on the first switch
    link.parent.mkdir()
    link.write_bytes(b"a saved job")

    assert monarch(tmp_path, "context", "create", "a").returncode == 0
    assert (tmp_path / ".monarch" / "a").is_dir()
    switched = monarch(tmp_path, "context", "use", "a")
    assert switched.returncode == 0, switched.stderr
    assert link.is_symlink() and os.readlink(link) == os.path.join("a", "state.pkl")
    assert (tmp_path / ".monarch" / "default" / "state.pkl").read_bytes() == b"a saved job"

    listed = monarch(tmp_path, "context", "ls")
    assert listed.stdout.split("\n")[:2] == ["* a", "  default"], listed.stdout

    # saving through the link writes the active context's job
    link.write_bytes(b"the job of a")
    assert (tmp_path / ".monarch" / "a" / "state.pkl").read_bytes() == b"the job of a"

    assert monarch(tmp_path, "context", "use", "default").returncode == 0
    assert link.read_bytes() == b"a saved job"
    (tmp_path / ".monarch" / "a" / "state.pkl").unlink()  # nothing there to kill
    removed = monarch(tmp_path, "context", "rm", "a")
    assert removed.returncode == 0, removed.stderr
    assert not (tmp_path / ".monarch" / "a").exists()
    assert monarch(tmp_path, "context", "ls").stdout.split("\n")[0] == "* default"


def test_a_context_name_is_one_folder_name(tmp_path: Path) -> None:
    for bad in ("..", "a/b", "job_state.pkl"):
        done = monarch(tmp_path, "context", "create", bad)
        assert done.returncode == 1
        assert "a context name is one folder name" in done.stderr
    assert not (tmp_path / ".monarch").exists() or not any((tmp_path / ".monarch").iterdir())
