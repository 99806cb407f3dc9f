"""Stress: calls cast from the client's own thread to a mesh with a dead proc must all end.

Not a benchmark (nothing is timed): a reproduction of the gather's peer-lost race. The client
spawns two procs, kills one, waits until the runtime has declared it failed, then makes
``--calls`` calls from ``--threads`` threads, each waiting on its call before the next (so
each is cast by its thread, not on the loop: ``_cast_here``). A call not ended within
``--wait`` seconds counts as hung. Prints how many ended and how many hung; exit status 1 if
any hung.

    python benchmarks/dead_peer_stress.py --calls 20000 --loop asyncio
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import monarch.actor
from monarch.actor import Actor, SupervisionError, endpoint, this_host
from monarch.config import configure
from monarch.core import current_runtime


class Echo(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def ping(self) -> int:
        return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--wait", type=float, default=5.0, help="seconds a call may take")
    parser.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    args = parser.parse_args()
    configure(event_loop=args.loop)  # read when the runtime starts
    monarch.actor.unhandled_fault_hook = lambda failure: None  # the kill is deliberate

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("echo", Echo)
    pids = mesh.pid.call().get(timeout=30)
    os.kill(pids.item(gpus=0), signal.SIGKILL)
    runtime = current_runtime()
    deadline = time.monotonic() + 10
    while not runtime.failed_peers and time.monotonic() < deadline:
        mesh.ping.call().exception(timeout=1)  # until the failure is known
    ended = errors = hung = 0
    lock = threading.Lock()

    def caller(calls: int) -> None:
        nonlocal ended, errors, hung
        for _ in range(calls):
            try:
                mesh.ping.call().get(timeout=args.wait)  # waited on: the next is cast here
            except SupervisionError:
                with lock:
                    errors += 1
            except TimeoutError:
                with lock:
                    hung += 1
                continue
            with lock:
                ended += 1

    threads = [
        threading.Thread(target=caller, args=(args.calls // args.threads,))
        for _ in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    loop = type(runtime.loop).__module__
    print(json.dumps({"loop": loop, "calls": ended + hung, "errors": errors, "hung": hung}))
    sys.stdout.flush()
    os._exit(1 if hung else 0)  # no orderly shutdown: the hung calls would wait on it


if __name__ == "__main__":
    main()
