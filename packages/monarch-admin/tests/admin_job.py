"""A job with an admin server, driven by the tests through stdin (one command a line).

It prints one JSON line ``{"url", "addr", "token"}`` once its actors run, then answers
each command with a line ``ok <command>``:

* ``ping N``: N calls to every worker (messages per second to show); ``ping-one N``: to
  worker 1 only;
* ``hang``: worker 0 starts an endpoint that sleeps for 10 minutes (a stuck actor);
* ``queue N``: N calls to worker 0, not waited for (they queue behind ``hang``);
* ``fail``: worker 1 fails (a broadcast whose endpoint raises: nobody to tell);
* ``block``: the async actor holds its proc's GIL for 10 minutes (not answering);
* ``torch``: worker 1 imports torch, then multiplies matrices for 2 minutes;
* ``stop``: the workers' proc mesh stops;
* ``quit``: the job ends.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import monarch.actor
from monarch.actor import Actor, MeshFailure, endpoint, this_host
from monarch.admin import start_admin
from monarch.core import current_runtime


class Worker(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def hang(self, seconds: float) -> None:
        time.sleep(seconds)  # the stack the tests look for: Worker.hang

    @endpoint
    def fail(self) -> None:
        raise RuntimeError("disk on fire")

    @endpoint
    def use_torch(self) -> None:
        import torch  # noqa: F401 - only this proc uses torch

    @endpoint
    def matmuls(self, seconds: float) -> int:
        import torch

        matrix, done, end = torch.ones(64, 64), 0, time.monotonic() + seconds
        while time.monotonic() < end:  # aten::mm, for the torch profiler to see
            matrix @ matrix
            done += 1
        return done


class Looper(Actor):
    @endpoint
    async def ping(self) -> int:
        return 1

    @endpoint
    async def block(self, seconds: float) -> None:
        """Hold the GIL (as a long C call that keeps it does): no other thread of the proc,
        its loop's included, runs, so the proc cannot answer."""
        sys.setswitchinterval(seconds + 60)  # the GIL is not handed over while this runs
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass


def quiet_hook(failure: MeshFailure) -> None:
    print(f"fault {failure.mesh_name}", file=sys.stderr, flush=True)


def main() -> None:
    monarch.actor.unhandled_fault_hook = quiet_hook
    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    workers_procs = this_host().spawn_procs(per_host={"gpus": 2}, name="workers")
    workers = workers_procs.spawn("workers", Worker)
    loop_procs = this_host().spawn_procs(per_host={"gpus": 1}, name="loopers")
    looper = loop_procs.spawn("looper", Looper)
    workers.ping.call().get()
    looper.ping.call().get()
    server = start_admin("127.0.0.1:0", timeout=timeout, quiet=True)
    secret = current_runtime().secret.hex()  # the tests prove it is accepted too
    hello = {"url": server.url, "addr": server.addr, "token": server.token, "secret": secret}
    print(json.dumps(hello), flush=True)
    queued = []
    for line in sys.stdin:
        command, *args = line.split()
        if command == "ping":
            for _ in range(int(args[0])):
                workers.ping.call().get()
        elif command == "ping-one":
            for _ in range(int(args[0])):
                workers.slice(gpus=1).ping.call_one().get()
        elif command == "hang":
            workers.slice(gpus=0).hang.call_one(600.0)
        elif command == "queue":
            queued += [workers.slice(gpus=0).ping.call_one() for _ in range(int(args[0]))]
        elif command == "fail":
            workers.slice(gpus=1).fail.broadcast()
        elif command == "block":
            looper.block.call_one(600.0)
        elif command == "torch":
            workers.slice(gpus=1).use_torch.call_one().get()
            queued.append(workers.slice(gpus=1).matmuls.call_one(120.0))
        elif command == "stop":
            workers_procs.stop().get()
        elif command == "quit":
            break
        print(f"ok {command}", flush=True)
    server.close()
    asyncio.run(asyncio.sleep(0))


if __name__ == "__main__":
    main()
