"""SlurmJob on a real multi-node Slurm: slurmctld in one network-namespace host (where the
client scripts run, as on a login node) and a slurmd in each of 4 others
(tools/slurm/start-netns.sh, as shared/infra/slurm and shared/infra/netns say).

A torchrun-style DDP script runs twice on the same 2-node allocation with equal losses; a
mesh across the 4 hosts is reached by a call and a cast, a host cut off (its link down), a
killed worker and a cancelled step each reach the owning actor's ``__supervise__`` as
MeshFailures naming the ranks they took, and ``job.kill()`` leaves no process on any host.
"""

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
from jobkit import Script, drop_hosts, ip, make_hosts, netns_of

from monarch.core.testing import Child, alive, wait_until

pytestmark = pytest.mark.system  # Slurm and munge (tools/system-packages.sh), daemons
HERE = Path(__file__).parent
START = HERE.parents[2] / "tools" / "slurm" / "start-netns.sh"
NODES = 4

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed (pkg-jobs)"
)


class Cluster:
    """The namespaces, and how a client in the controller's reaches Slurm."""

    def __init__(self, hosts: list[str], folder: Path) -> None:
        self.controller, self.nodes = hosts[0], hosts[1:]
        # sbatch passes the client's environment on to the job's steps. gloo picks its
        # interface from the host name, which names the machine, not the namespace: as on
        # a cluster whose host names do not resolve to the nodes' fabric, it is named.
        self.env = {"SLURM_CONF": str(folder / "slurm.conf"), "GLOO_SOCKET_IFNAME": "eth0"}
        self.prefix = ["ip", "netns", "exec", self.controller]

    def slurm(self, *argv: str) -> str:
        """A Slurm command run from the controller's host; its output."""
        done = subprocess.run(
            [*self.prefix, *argv],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def python(self, code: str, folder: Path) -> subprocess.CompletedProcess[str]:
        """``python -c code`` as a client on the controller's host, in ``folder``."""
        return subprocess.run(
            [*self.prefix, sys.executable, "-c", code],
            cwd=folder,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def left(self) -> dict[str, list[str]]:
        """What runs on each node besides its slurmd: ``{node: [comm, ...]}``."""
        found = {}
        for node in self.nodes:
            pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True)
            names = []
            for pid in pids.stdout.split():
                try:
                    names.append(Path(f"/proc/{pid}/comm").read_text().strip())
                except OSError:
                    continue  # it has just ended
            found[node] = [name for name in names if name != "slurmd"]
        return found

    def idle(self) -> bool:
        return not self.slurm("squeue", "-h").strip() and not any(self.left().values())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Five namespace hosts: h1 runs slurmctld (and the clients), h2..h5 a slurmd each.
    Where that cannot be made (not root, no Slurm: tools/system-packages.sh installs it)
    the tests fail saying so; they are not silently skipped."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the multi-node Slurm tests need root and iproute2 (network namespaces)")
    if shutil.which("slurmd") is None or shutil.which("slurmctld") is None:
        pytest.fail("no Slurm here: tools/system-packages.sh installs it (as root)")
    prefix = f"ms{os.getpid() % 100000}"
    folder = tmp_path_factory.mktemp("slurm-netns")
    try:
        hosts = make_hosts(1 + NODES, prefix)
        done = subprocess.run(
            ["bash", str(START), str(folder), *hosts], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            pytest.fail(f"the netns Slurm cluster did not start: {done.stderr}")
        yield Cluster(hosts, folder)
    finally:
        drop_hosts(prefix)  # its daemons, and whatever a failed test left, with them


@pytest.fixture
def idle(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, with nothing allocated and nothing left on its nodes after the test
    (``job.kill()`` returns once Slurm took the cancel; its nodes end the steps after)."""
    yield cluster
    wait_until(cluster.idle, 60, f"the cluster is idle again: {cluster.left()}")


@needs_torch
def test_a_ddp_script_runs_twice_on_one_two_node_allocation_with_equal_losses(
    idle: Cluster, tmp_path: Path
) -> None:
    script = Script(tmp_path, prefix=idle.prefix, env=idle.env)
    logs = str(tmp_path / "slurm-logs")
    out = str(tmp_path / "ranks.jsonl")
    done = script.run("spmd-slurm", str(HERE / "ddp_train.py"), out, logs)
    try:
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        result = json.loads(lines[-1])
        first, second = result["runs"]
        # The losses of both runs, printed; equal, and falling.
        assert lines[0] == f"run 1: losses {first['losses']}"
        assert lines[1] == f"run 2: losses {second['losses']}"
        assert first["losses"] == second["losses"]
        assert first["losses"][-1] < first["losses"][0]
        # 2 procs on each of the 2 nodes (h2, h3), both runs, in one allocation.
        ranks = [[0, "10.0.0.2"], [1, "10.0.0.2"], [2, "10.0.0.3"], [3, "10.0.0.3"]]
        assert first["at"] == second["at"] == ranks
        assert len(result["slurm_jobs"]) == 1
        assert "monarch_job RUNNING" in idle.slurm("squeue", "-h", "-o", "%j %T")
    finally:
        killed = script.run("kill")
        assert killed.returncode == 0, killed.stderr


def start_mesh(cluster: Cluster, folder: Path) -> tuple[Child, dict[str, Any]]:
    """mesh_script.py with a SlurmJob of every node; its first report."""
    script = [sys.executable, str(HERE / "mesh_script.py"), "slurm", str(NODES)]
    argv = [*cluster.prefix, *script, str(folder / "slurm-logs")]
    dialog = Child(argv, {**os.environ, **cluster.env}, stdin=True, cwd=folder)
    return dialog, dialog.json(180)


def check_reached(first: dict[str, Any]) -> None:
    """A call reached every actor, after a cast that each counted: 2 on every host."""
    actors = first["actors"]
    points = [(a["point"]["hosts"], a["point"]["gpus"]) for a in actors]
    assert sorted(points) == [(h, g) for h in range(NODES) for g in range(2)]
    assert all(a["casts"] == 1 for a in actors)
    where = {(a["point"]["hosts"], a["address"]) for a in actors}
    assert where == {(h, f"10.0.0.{h + 2}") for h in range(NODES)}  # host h is node h2+h


def failed_ranks(report: dict[str, Any]) -> list[int]:
    """The ranks of the actor mesh that failures named (each once)."""
    actors = [failure for failure in report["failures"] if failure["actors"]]
    return sorted(rank for failure in actors for rank in failure["ranks"])


def test_a_mesh_across_four_hosts_a_host_cut_off_and_a_kill_that_leaves_nothing(
    idle: Cluster, tmp_path: Path
) -> None:
    dialog, first = start_mesh(idle, tmp_path)
    try:
        check_reached(first)
        cut = idle.nodes[2]  # host 2 of the mesh (10.0.0.4): ranks 4 and 5
        ip("-n", cut, "link", "set", "eth0", "down")  # silent: no FIN, no RST
        dialog.send_line("[4, 5]")
        report = dialog.json(90)
        assert failed_ranks(report) == [4, 5], report
        assert all("heartbeat" in f["report"] for f in report["failures"]), report
        assert report["call"]["error"] == "SupervisionError", report
        assert report["call"]["seconds"] < 30, report
        assert not report["unhandled"], report
        # The host comes back, so that Slurm reaches it to end the job's step there.
        ip("-n", cut, "link", "set", "eth0", "up")
        dialog.send_line()
        assert dialog.json(60) == {"killed": True}
        wait_until(idle.idle, 60, f"no job, nothing left on any host: {idle.left()}")
    finally:
        ip("-n", idle.nodes[2], "link", "set", "eth0", "up")
        dialog.kill()
        if idle.slurm("squeue", "-h").strip():
            idle.slurm("scancel", "--user=root")


def worker_pids(cluster: Cluster, node: str) -> list[int]:
    """The ``monarch worker`` processes on ``node``."""
    pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True)
    found = []
    for pid in map(int, pids.stdout.split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"monarch.core.worker" in argv:  # python -m monarch.core.worker --listen ...
            found.append(pid)
    return found


@pytest.mark.parametrize("fault", ["kill a worker", "scancel the step"])
def test_a_node_that_dies_is_a_supervision_event_not_a_hang(
    idle: Cluster, tmp_path: Path, fault: str
) -> None:
    dialog, first = start_mesh(idle, tmp_path)
    try:
        check_reached(first)
        if fault == "kill a worker":
            (worker,) = worker_pids(idle, idle.nodes[1])  # host 1 (10.0.0.3): ranks 2, 3
            os.kill(worker, signal.SIGKILL)
            wait_until(lambda: not alive(worker), 10, "the killed worker is gone")
            expected = [2, 3]
        else:  # every node's worker ends with the step
            idle.slurm("scancel", f"{first['jobs']['hosts']}.0")
            expected = list(range(2 * NODES))
        dialog.send_line(json.dumps(expected))
        report = dialog.json(90)
        assert failed_ranks(report) == expected, report
        assert report["call"]["error"] == "SupervisionError", report
        assert report["call"]["seconds"] < 30, report
        dialog.send_line()
        assert dialog.json(60) == {"killed": True}
    finally:
        dialog.kill()
        if idle.slurm("squeue", "-h").strip():
            idle.slurm("scancel", "--user=root")


def test_a_batch_job_runs_its_client_in_the_allocation_and_ends_with_it(
    idle: Cluster, tmp_path: Path
) -> None:
    out, logs = tmp_path / "seen.json", tmp_path / "slurm-logs"
    client = f"{HERE / 'batch_client.py'} {out} {logs}"
    code = f"""if True:
        import sys
        from monarch.job import SlurmJob
        job = SlurmJob({{"hosts": 2}}, sys.executable, exclusive=False, log_dir={str(logs)!r})
        job.apply(client_script={client!r})
        print(job._jobs["hosts"])
    """
    done = idle.python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    # The client's own state() attached to the job it runs in, from the first node (h2).
    wait_until(out.exists, 120, f"the batch client wrote {out}: {idle.slurm('squeue')}")
    seen = json.loads(out.read_text())
    assert seen["batch"] == "1" and seen["job"] == job
    assert seen["client"] == netns_of(idle.nodes[0])
    assert seen["nets"] == [netns_of(node) for node in idle.nodes[:2]]
    # It ended, and the allocation with it: the idle fixture waits for nothing left.


def test_more_nodes_than_the_partition_has_says_why_it_waits_and_fails_at_the_deadline(
    idle: Cluster, tmp_path: Path
) -> None:
    code = f"""if True:
        import sys
        from monarch.job import JobError, SlurmJob
        job = SlurmJob({{"hosts": {NODES + 1}}}, sys.executable, exclusive=False, start_timeout=8)
        try:
            job.state()
        except JobError as exc:
            print(f"JobError: {{exc}}")
    """
    done = idle.python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    # squeue's reason, said while it waits (each time it changes: PartitionConfig, then
    # PartitionNodeLimit here), then the failure with the last; the idle fixture then
    # checks that the pending job was cancelled
    pending = [line for line in done.stderr.splitlines() if "is pending: " in line]
    reasons = [line.split("is pending: ")[1] for line in pending]
    assert reasons and len(set(reasons)) == len(reasons), done.stderr
    reason = reasons[-1]
    assert reason != "no reason given", pending
    assert f"{NODES + 1} nodes): its workers did not start within start_timeout (8s)" in (
        done.stdout
    ), done.stdout
    assert f"it was PENDING ({reason}), and is cancelled" in done.stdout, done.stdout
