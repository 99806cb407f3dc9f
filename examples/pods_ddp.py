"""A Kubernetes-style job from outside the cluster, on one machine: DDP through SPMDActor.

Upstream's Kubernetes DDP example runs, in each worker pod, ``python -u -c BOOTSTRAP``
where BOOTSTRAP writes the training script and then runs upstream's
``monarch._src.job.kubernetes._WORKER_BOOTSTRAP_SCRIPT``; its client, outside the cluster,
attaches to the pods, spawns a proc per GPU, streams their logs and runs the script with
``SPMDActor`` (``get_host_port(AddrType.IPv4)`` on the first proc for the rendezvous, then
``main``). Here the "pods" are processes of this machine (``MONARCH_POD_IP=127.0.0.1``, a
port each, the job secret in their environment, as a Secret gives it) and DDP runs on CPU
with gloo; the client's side is the same calls.

Run it with ``python examples/pods_ddp.py`` (needs torch).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from monarch._src.job.kubernetes import _WORKER_BOOTSTRAP_SCRIPT
from monarch.actor import attach_to_workers
from monarch.config import configure
from monarch.core import SECRET_ENV, job_secret
from monarch.spmd import SPMDActor
from monarch.tools.network import AddrType

PODS = 2
GPUS_PER_POD = 2

TRAIN = textwrap.dedent(
    """\
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(10, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        torch.manual_seed(step * 100 + rank)
        loss = model(torch.randn(4, 10)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    total = sum(p.detach().sum() for p in model.parameters()).reshape(1)
    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, total)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    print(f"rank {rank} of {dist.get_world_size()}: weights equal on every rank: {same}")
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_pod(train_script: Path, port: int) -> subprocess.Popen[bytes]:
    """A worker "pod": upstream's bootstrap, with the example's first lines before it."""
    bootstrap = (
        "import pathlib\n"
        f"pathlib.Path({str(train_script)!r}).write_text({TRAIN!r})\n" + _WORKER_BOOTSTRAP_SCRIPT
    )
    env = {**os.environ, "MONARCH_PORT": str(port), "MONARCH_POD_IP": "127.0.0.1"}
    log = (train_script.parent / f"pod-{port}.log").open("wb")  # a pod's own log
    argv = [sys.executable, "-u", "-c", bootstrap]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


async def main() -> None:
    configure(enable_log_forwarding=True)
    os.environ[SECRET_ENV] = job_secret().hex()  # the pods' Secret, and this client's
    folder = Path(tempfile.mkdtemp(prefix="pods-ddp-"))
    ports = [free_port() for _ in range(PODS)]
    pods = [start_pod(folder / "train.py", port) for port in ports]
    try:
        hosts = attach_to_workers(workers=[f"tcp://127.0.0.1:{port}" for port in ports])
        procs = hosts.spawn_procs({"gpus": GPUS_PER_POD})
        await procs.logging_option(stream_to_client=True)
        spmd = procs.spawn("_SPMDActor", SPMDActor)
        first = dict.fromkeys(procs._labels, 0)
        master_addr, master_port = await spmd.slice(**first).get_host_port.call_one(AddrType.IPv4)
        done = await spmd.main.call(master_addr, master_port, [str(folder / "train.py")])
        print(f"every rank ran the script: {all(done.values())}", flush=True)
        await hosts.shutdown()  # the pods' workers exit (status 0)
        print(f"pods exited: {[pod.wait(30) for pod in pods]}", flush=True)
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()


if __name__ == "__main__":
    asyncio.run(main())
