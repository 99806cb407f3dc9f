"""exec_command on the hosts of a real ProcessJob (worker processes): the rank environment,
exit statuses, one rank only, output files, bad input."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch.core import HostMesh
from monarch.core.testing import wait_until
from monarch.job import ProcessJob, exec_command

TIMEOUT = 60


@pytest.fixture(scope="module")
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 2})
    try:
        yield job
    finally:
        job.kill()


@pytest.fixture(scope="module")
def hosts(job: ProcessJob) -> HostMesh:
    return job.state(cached_path=None).hosts


def procs_of(job: ProcessJob) -> list[int]:
    """The processes the job's workers started: their procs, and their zygotes' forks (a
    zygote's successor, which preloads torch and forks later procs, is a zygote too)."""
    found = []
    for worker in (w for ws in job._workers.values() for w in ws):
        found += children_of(worker.pid)
    procs = []
    while found:
        pid = found.pop()
        try:
            zygote = b"_zygote_proc" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:  # ended meanwhile
            continue
        if zygote:
            found += children_of(pid)
        else:
            procs.append(pid)
    return procs


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:  # ended meanwhile
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return found


def logs(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


def test_every_proc_runs_the_command_with_its_rank_and_no_job_secret(
    hosts: HostMesh, tmp_path: Path
) -> None:
    line = (
        "echo $MONARCH_RANK_HOSTS/$MONARCH_SIZE_HOSTS $MONARCH_RANK_GPUS/$MONARCH_SIZE_GPUS "
        "${MONARCH_JOB_SECRET:-nosecret} $EXTRA $(pwd)"
    )
    status = exec_command(
        hosts,
        line,
        env={"EXTRA": "x y"},
        workdir="/tmp",
        output_dir=str(tmp_path),
        per_host={"gpus": 2},
    ).get(timeout=TIMEOUT)
    assert status == 0
    assert logs(tmp_path) == {
        f"hosts{h}-gpus{g}.log": f"{h}/2 {g}/2 nosecret x y /tmp\n" for h in (0, 1) for g in (0, 1)
    }


def test_the_status_is_the_first_failure_in_rank_order(hosts: HostMesh) -> None:
    assert exec_command(hosts, "exit $((MONARCH_RANK_HOSTS + 3))").get(TIMEOUT) == 3
    assert exec_command(hosts, ["sh", "-c", "exit $((MONARCH_RANK_HOSTS * 5))"]).get(TIMEOUT) == 5
    assert exec_command(hosts, ["true"]).get(TIMEOUT) == 0
    assert exec_command(hosts, ["/no/such/program"]).get(TIMEOUT) == 127


def test_rank_or_point_runs_it_at_one_place_only(hosts: HostMesh, tmp_path: Path) -> None:
    assert exec_command(hosts, "echo hi", output_dir=str(tmp_path), rank=1).get(TIMEOUT) == 0
    assert logs(tmp_path) == {"hosts1.log": "hi\n"}
    out = tmp_path / "by-point"
    status = exec_command(
        hosts,
        "echo $MONARCH_RANK_GPUS",
        output_dir=str(out),
        point={"hosts": 0, "gpus": 2},
        per_host={"gpus": 3},
    ).get(TIMEOUT)
    assert status == 0 and logs(out) == {"hosts0-gpus2.log": "2\n"}


def test_bad_input_is_refused_clearly(hosts: HostMesh, job: ProcessJob) -> None:
    with pytest.raises(ValueError, match="empty"):
        exec_command(hosts, "  ")
    with pytest.raises(ValueError, match="non-empty argv"):
        exec_command(hosts, [])
    with pytest.raises(ValueError, match=r"rank 2 is not in 0..1"):
        exec_command(hosts, "true", rank=2)
    with pytest.raises(ValueError, match="no dimension 'gpus'"):
        exec_command(hosts, "true", point={"gpus": 0})
    with pytest.raises(ValueError, match="outside"):
        exec_command(hosts, "true", point={"hosts": 5})
    with pytest.raises(ValueError, match="not both"):
        exec_command(hosts, "true", rank=0, point={"hosts": 0})
    with pytest.raises(ValueError, match="never get the job secret"):
        exec_command(hosts, "true", env={"MONARCH_JOB_SECRET": "00"})
    wait_until(lambda: not procs_of(job), 30, "no procs left behind by the refused commands")
