"""Drop-in ``ProcessJob``, as upstream's: four local workers acting as hosts, three procs on
each, answer; shutting the host mesh down (``shutdown()``, or leaving ``async with``) ends
the procs and the workers without a failure reaching the client's fault hook (which would
end the client).

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0. The client is a process of its own: a failure at its root would end it.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

_CLIENT = """if True:
    import asyncio, os, sys, time
    from monarch.actor import Actor, endpoint, this_host
    from monarch.job import ProcessJob

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    def spawn(hosts):
        return hosts.spawn_procs(per_host={"gpus": 3}).spawn("pid", Pid).pid.call()

    hosts = ProcessJob({"hosts": 4}).state(cached_path=None).hosts
    if sys.argv[1] == "shutdown":
        pids = sorted(spawn(hosts).get(timeout=120).values())
        hosts.shutdown().get(timeout=60)
    else:
        async def leave() -> list[int]:
            async with hosts:
                return sorted((await spawn(hosts)).values())
        pids = asyncio.run(leave())
    deadline = time.monotonic() + 30
    while any(map(alive, pids)):  # the procs end with their hosts
        assert time.monotonic() < deadline, [pid for pid in pids if alive(pid)]
        time.sleep(0.05)
    # The client goes on: its own procs start and answer (meanwhile, a failure of the
    # procs that were shut down, gone now, would have reached its fault hook).
    local = this_host().spawn_procs(per_host={"gpus": 1})
    assert local.spawn("pid", Pid).pid.call_one().get(timeout=120) != os.getpid()
    local.stop().get(timeout=60)
    print(pids, flush=True)
"""


@pytest.mark.parametrize("how", ["shutdown", "async-with"])
def test_twelve_procs_on_four_process_hosts_answer_and_shut_down(how: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT, how],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "Unhandled monarch error" not in done.stderr, done.stderr
    pids = ast.literal_eval(done.stdout.splitlines()[-1])
    assert len(set(pids)) == 12
