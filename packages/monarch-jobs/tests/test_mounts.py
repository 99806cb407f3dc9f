"""``job.remote_mount`` / ``gather_mount`` on a real ProcessJob (worker processes): a client
directory readable by the procs of every host, kept up to date by ``refresh_mounts()``, and
each host's directory gathered here under its key."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import ProcessJob

TIMEOUT = 60


class Files(Actor):
    @endpoint
    def read(self, path: str) -> str:
        return Path(path).read_text()

    @endpoint
    def write_result(self, root: str) -> None:
        rank = current_rank()["hosts"]
        out = Path(root) / f"hosts_{rank}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.txt").write_text(f"rank {rank}")

    @endpoint
    def python(self) -> str | None:
        """The interpreter the proc was started with (set by the wrapper below)."""
        return os.environ.get("MOUNTED_PYTHON")


def test_remote_and_gather_mounts_follow_changes(tmp_path: Path) -> None:
    src, mnt, out, gathered = (tmp_path / d for d in ("src", "mnt", "out", "gathered"))
    (src / "conf").mkdir(parents=True)
    (src / "conf" / "lr.txt").write_text("0.1")
    job = ProcessJob({"hosts": 2})
    job.remote_mount(str(src), mntpoint=str(mnt))
    job.gather_mount(str(out / "$SUBDIR"), str(gathered))
    try:
        hosts = job.state(cached_path=None).hosts
        files = hosts.spawn_procs(per_host={"gpus": 1}).spawn("files", Files)
        lr = str(mnt / "conf" / "lr.txt")
        assert files.read.call(lr).get(timeout=TIMEOUT).values() == ["0.1", "0.1"]

        (src / "conf" / "lr.txt").write_text("0.05")
        files.write_result.call(str(out)).get(timeout=TIMEOUT)
        changed = job.refresh_mounts()
        assert files.read.call(lr).get(timeout=TIMEOUT).values() == ["0.05", "0.05"]
        assert sorted(changed) == [
            str(gathered / "hosts_0" / "result.txt"),
            str(gathered / "hosts_1" / "result.txt"),
        ]
        assert (gathered / "hosts_1" / "result.txt").read_text() == "rank 1"
        assert job.refresh_mounts() == []  # nothing changed: nothing travels
    finally:
        job.kill()


def test_remote_mount_python_exe_starts_procs_with_the_mounted_interpreter(
    tmp_path: Path,
) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    python = src / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nMOUNTED_PYTHON="$0" exec {sys.executable} "$@"\n')
    python.chmod(0o755)  # the copy keeps its mode: it runs there
    job = ProcessJob({"hosts": 1})
    job.remote_mount(str(src), mntpoint=str(mnt))  # python_exe: upstream's ".venv/bin/python"
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 1})
        used = procs.spawn("files", Files).python.call_one().get(timeout=TIMEOUT)
        assert used == str(mnt / ".venv" / "bin" / "python")
    finally:
        job.kill()


def test_mounts_refuse_bad_input(tmp_path: Path) -> None:
    job = ProcessJob({"hosts": 1})
    with pytest.raises(TypeError, match="FUSE"):
        job.remote_mount(str(tmp_path), cache_size=3)
    with pytest.raises(RuntimeError, match=r"call job\.state\(\) first"):
        job.refresh_mounts()
    job.remote_mount(str(tmp_path / "missing"))
    try:
        with pytest.raises(FileNotFoundError, match="missing"):
            job.state(cached_path=None)
    finally:
        job.kill()
