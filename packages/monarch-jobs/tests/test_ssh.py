"""SSHJob against real sshds, each in a network namespace host (tools/ssh, as
shared/infra/ssh and shared/infra/netns): the client script runs in host 1, its workers are
started over ssh in hosts 2 and 3, and a re-run re-attaches to them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobkit import SSH_ARGS, Script, drop_hosts, make_hosts, netns_of, start_sshd

from monarch.core.testing import alive, wait_until
from monarch.job import JobError, SSHJob, job_load

pytestmark = pytest.mark.system  # an sshd per host (openssh-server: tools/system-packages.sh)

MONARCH = shutil.which("monarch", path=str(Path(sys.executable).parent)) or "monarch"


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[str]]:
    """Three namespace hosts (10.0.0.1-3), an sshd in the 2nd and 3rd. Where that cannot
    be made (not root, no sshd: tools/system-packages.sh installs it) the tests fail
    saying so; they are not silently skipped."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("SSHJob's tests need root and iproute2 (network namespaces)")
    if not Path("/usr/sbin/sshd").exists():
        pytest.fail("no sshd here: tools/system-packages.sh installs openssh-server (as root)")
    prefix = f"mj{os.getpid() % 100000}"
    try:
        names = make_hosts(3, prefix)
        for i in (2, 3):
            start_sshd(names[i - 1], f"10.0.0.{i}:22", f"/run/{prefix}-sshd{i}.pid")
        yield names
    finally:
        drop_hosts(prefix)


def cmdlines() -> str:
    """Every process's command line, as ps would show them."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return "\n".join(found)


def ssh_job(**extra: object) -> str:
    spec = {
        "hosts": ["root@10.0.0.2", "root@10.0.0.3"],
        "python_exe": sys.executable,
        "ssh_args": SSH_ARGS,
        **extra,
    }
    return json.dumps(spec)


def test_workers_start_over_ssh_on_other_hosts_and_a_rerun_reattaches(
    hosts: list[str], tmp_path: Path
) -> None:
    script = Script(tmp_path, prefix=["ip", "netns", "exec", hosts[0]])
    saved = tmp_path / ".monarch" / "job_state.pkl"
    try:
        first, said = script("ssh", ssh_job())
        assert "Saving job to cache" in said
        # One actor on each of the other hosts: their procs run in those namespaces.
        assert sorted(first["nets"]) == sorted(netns_of(h) for h in hosts[1:])
        workers = first["workers"]
        assert len(set(workers)) == 2 and all(map(alive, workers))  # they outlive the login
        job = job_load(saved)
        assert isinstance(job, SSHJob)
        secret = job._secret.hex()
        assert len(secret) >= 32 and secret not in cmdlines()  # on no command line

        again, said = script("ssh", ssh_job())
        assert "Job is running, returning current state" in said
        assert again["workers"] == workers

        # `monarch exec` from host 1 runs a command on the job's hosts, in their namespaces.
        ran = subprocess.run(
            [*script.prefix, MONARCH, "exec", "--", "readlink", "/proc/self/ns/net"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.splitlines() == [
            f"[hosts={i}] {netns_of(host)}" for i, host in enumerate(hosts[1:])
        ]

        os.killpg(workers[0], signal.SIGKILL)  # a worker dies: the next run starts anew
        wait_until(lambda: not alive(workers[0]), 10, "the killed worker is gone")
        fresh, said = script("ssh", ssh_job())
        assert "no longer runs; starting anew" in said
        assert not set(fresh["workers"]) & set(workers)
        assert not alive(workers[1])  # what was left of the old job (it held the port)

        assert script("kill")[0] == {"killed": True}  # over ssh, from host 1
        assert not any(map(alive, fresh["workers"]))
    finally:
        if saved.exists():
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    hosts[0],
                    sys.executable,
                    "-c",
                    f"from monarch.job import job_load; job_load({str(saved)!r}).kill()",
                ],
                capture_output=True,
            )


def test_a_worker_that_cannot_start_says_why(hosts: list[str], tmp_path: Path) -> None:
    script = Script(tmp_path, prefix=["ip", "netns", "exec", hosts[0]])
    done = script.run("ssh", ssh_job(python_exe="/no/such/python"))
    assert done.returncode != 0
    assert "root@10.0.0.2: exit 3: the worker exited before it listened" in done.stderr
    assert "/no/such/python" in done.stderr


def test_an_unreachable_host_is_a_job_error_with_ssh_s_stderr(tmp_path: Path) -> None:
    # The root namespace routes 10.0.0.0/24 nowhere (the hosts fixture's guard route), and
    # nothing listens at 127.0.0.1:1: both fail at once.
    job = SSHJob(["root@127.0.0.1"], ssh_args=[*SSH_ARGS, "-p", "1"])
    with pytest.raises(JobError, match=r"root@127.0.0.1: ssh could not log in: .*refused"):
        job.apply()


def test_bad_input_is_refused_clearly() -> None:
    with pytest.raises(TypeError, match="not one string"):
        SSHJob("node1")
    with pytest.raises(ValueError, match="no hosts"):
        SSHJob([])
    with pytest.raises(ValueError, match="not an ssh destination"):
        SSHJob(["-oProxyCommand=evil"])
    with pytest.raises(ValueError, match="identifier"):
        SSHJob({"my hosts": ["a"]})
    with pytest.raises(ValueError, match="port number"):
        SSHJob(["a"], monarch_port=70000)
    with pytest.raises(TypeError, match="not one string"):
        SSHJob(["a"], ssh_args="-p 2222")
