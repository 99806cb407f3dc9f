"""Producers flooding one port: how often the receiver's ``recv()`` returns, and its memory.

The reduced case of an RL pipeline that crawled: ``--producers`` async actors (a proc each)
run a background task that sends to one receiver's port in a tight loop (``port.send(...)``
then ``await asyncio.sleep(0)``); the receiver, an async actor in a proc of its own, counts
its ``recv()`` returns for ``--seconds`` while the flood goes on, and reports the peak RSS
of its process. Written against upstream's public API only, so upstream torchmonarch runs
it too::

    python benchmarks/port_flood.py --producers 4 --seconds 5
    benchmarks/.venvs/upstream/bin/python benchmarks/port_flood.py

Prints one JSON line: receives, receives per second, the receiver's RSS at start and peak
(MiB), sampled every 0.25 s by the receiver itself, what the producers sent and the largest
producer RSS at the end. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from monarch.actor import Actor, Channel, Port, endpoint, this_host


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Producer(Actor):
    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.sent = 0

    @endpoint
    async def start(self, port: Port[Any], size: int) -> None:
        payload = {"rollout": b"x" * size, "producer": os.getpid()}

        async def flood() -> None:
            while True:
                port.send(payload)
                self.sent += 1
                await asyncio.sleep(0)

        self.task = asyncio.get_running_loop().create_task(flood())

    @endpoint
    async def halt(self) -> tuple[int, float]:
        if self.task is not None:
            self.task.cancel()
        return self.sent, rss_mib()


class Receiver(Actor):
    def __init__(self) -> None:
        self.port, self.receiver = Channel[Any].open()

    @endpoint
    async def get_port(self) -> Port[Any]:
        return self.port

    @endpoint
    async def count(self, seconds: float) -> dict[str, Any]:
        start_rss = peak = rss_mib()
        received = 0
        start = time.monotonic()
        end = start + seconds
        sampled = start
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self.receiver.recv(), left)
            except TimeoutError:
                break
            received += 1
            now = time.monotonic()
            if now - sampled > 0.25:
                peak, sampled = max(peak, rss_mib()), now
        peak = max(peak, rss_mib())
        elapsed = time.monotonic() - start
        return {
            "receives": received,
            "per_second": round(received / elapsed, 1),
            "rss_start_mib": round(start_rss, 1),
            "rss_peak_mib": round(peak, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per message")
    args = parser.parse_args()
    receiver = this_host().spawn_procs(per_host={"procs": 1}).spawn("receiver", Receiver)
    producers = (
        this_host().spawn_procs(per_host={"procs": args.producers}).spawn("producers", Producer)
    )
    port = receiver.get_port.call_one().get(timeout=60)
    producers.start.call(port, args.size).get(timeout=60)
    counted = receiver.count.call_one(args.seconds).get(timeout=args.seconds + 120)
    halted = producers.halt.call().get(timeout=120).values()
    result = {
        "producers": args.producers,
        "seconds": args.seconds,
        **counted,
        "sent": sum(sent for sent, _ in halted),
        "producer_rss_end_mib": round(max(rss for _, rss in halted), 1),
    }
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the flood's backlog need not drain


if __name__ == "__main__":
    main()
