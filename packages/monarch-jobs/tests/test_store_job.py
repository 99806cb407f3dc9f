"""StoreJob: the ranks of a real torchrun job (torch.distributed.run) find Monarch's hosts
through their rendezvous store; on one host (ipc) and across two network-namespace hosts
(tcp), each host's worker started by its first rank and ending with it."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobkit import drop_hosts, make_hosts, netns_of

from monarch.core.testing import alive, wait_until
from monarch.job import JobError
from monarch.job.spmd import StoreJob

SCRIPT = Path(__file__).with_name("store_script.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (pkg-jobs)"
)


def report(output: str) -> dict[str, Any]:
    """Rank 0's JSON line, among torchrun's own."""
    lines = [text for text in output.splitlines() if text.startswith('{"extent"')]
    assert len(lines) == 1, output[-3000:]
    (line,) = lines
    found: dict[str, Any] = json.loads(line)
    return found


@needs_torch
def test_the_ranks_of_one_host_share_its_worker(tmp_path: Path) -> None:
    done = subprocess.run(
        [*TORCHRUN, "--standalone", "--nnodes=1", "--nproc-per-node=2", str(SCRIPT), "ipc"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a crash says where (seen once)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = report(done.stdout)
    assert found["extent"] == {"hosts": 1}
    assert [a["point"] for a in found["actors"]] == [{"hosts": 0, "gpus": g} for g in (0, 1)]
    (worker,) = {a["worker"] for a in found["actors"]}
    wait_until(lambda: not alive(worker), 30, "the worker ends with its rank")


@pytest.fixture
def hosts() -> Iterator[list[str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the two-host test needs root and iproute2 (network namespaces)")
    prefix = f"mt{os.getpid() % 100000}"
    try:
        yield make_hosts(2, prefix)
    finally:
        drop_hosts(prefix)


@needs_torch
def test_a_torchrun_job_on_two_hosts_attaches_to_a_worker_on_each(
    hosts: list[str], tmp_path: Path
) -> None:
    # gloo's interface: the host name names the machine, not a namespace (see test_slurm_netns)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
    nodes: list[subprocess.Popen[str]] = []
    for rank, host in enumerate(hosts):
        argv = [
            *TORCHRUN,
            "--nnodes=2",
            "--nproc-per-node=2",
            f"--node-rank={rank}",
            "--master-addr=10.0.0.1",
            "--master-port=29500",
            str(SCRIPT),
            "tcp",
        ]
        nodes.append(
            subprocess.Popen(
                ["ip", "netns", "exec", host, *argv],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [node.communicate(timeout=180) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    for done, (out, err) in zip(nodes, outputs, strict=True):
        assert done.returncode == 0, (out[-2000:], err[-3000:])
    found = report(outputs[0][0])  # rank 0 runs on the first host
    assert found["extent"] == {"hosts": 2}
    nets = [(a["point"]["hosts"], a["net"]) for a in found["actors"]]
    assert nets == [(h, netns_of(hosts[h])) for h in (0, 1) for _ in (0, 1)]
    workers = {a["worker"] for a in found["actors"]}
    assert len(workers) == 2
    wait_until(lambda: not any(map(alive, workers)), 30, "the workers end with their ranks")


@needs_torch
def test_a_worker_ends_even_when_its_rank_is_killed(tmp_path: Path) -> None:
    code = """if True:
        import sys
        import torch.distributed as dist
        from monarch.job import _store
        from monarch.job.spmd import StoreJob
        job = StoreJob.from_store(
            dist.HashStore(), rank=0, local_rank=0, world_size=1, local_world_size=1
        )
        print(_store._started[0].pid, job._worker_addrs[0], flush=True)
        sys.stdin.readline()
    """
    rank = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None
        pid, address = rank.stdout.readline().split()
        assert address.startswith("unix://@monarch-store-monarch_worker-0-")
        assert alive(int(pid))
        rank.send_signal(signal.SIGKILL)
        rank.wait(10)
        wait_until(lambda: not alive(int(pid)), 30, "the worker of a SIGKILLed rank ends")
    finally:
        if rank.poll() is None:
            rank.kill()
        rank.communicate(timeout=10)


def test_bad_input_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoStore:
        def set(self, key: str, value: str) -> None:
            raise AssertionError("not reached")

        def get(self, key: str) -> bytes:
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="transport 'metatls' is not offered here"):
        StoreJob.from_store(NoStore(), transport="metatls")
    with pytest.raises(ValueError, match="port number"):
        StoreJob.from_store(NoStore(), monarch_port=-1)
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(JobError, match="needs RANK"):
        StoreJob.from_store(NoStore())
    with pytest.raises(ValueError, match="multiple of LOCAL_WORLD_SIZE"):
        StoreJob.from_store(NoStore(), rank=0, local_rank=0, world_size=3, local_world_size=2)
    with pytest.raises(ValueError, match="identifier"):
        StoreJob(["tcp://10.0.0.1:1"], "my hosts")
