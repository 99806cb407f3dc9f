"""``job.remote_mount`` / ``gather_mount`` on a real ProcessJob (worker processes): a client
directory readable by the procs of every host, kept up to date by ``refresh_mounts()``, and
each host's directory gathered here under its key."""

from __future__ import annotations

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
