"""The machine's floor for a gathered call to N procs: the worker side of ``scale_bench --floor``.

What any Python framework with our structure pays at least, measured on the same machine in
the same run: N forked Python processes, each with an event loop (uvloop when installed)
reading a socket and a second thread that answers, as a proc's runtime loop hands a message
to its actor's thread; the parent sends each a few bytes and waits for every answer::

    python _scale_floor.py --procs 256 --json OUT [--calls 30] [--inline]

No framing, authentication, serialization, ordering, routing or supervision: a round is
the wake-ups, the thread hand-off and the system calls. ``--inline``: the loop answers
itself (no second thread). Records the round's median (``call_ms``) and the procs' CPU per
round, per proc (``procs_cpu_us``, from ``/proc``, as ``_scale_workload`` reads ours).
Standard library only, and uvloop when importable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import cpu_seconds, write_result


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop, as our procs run, where installed; else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def serve(sock: socket.socket, inline: bool) -> None:
    """A child: answer each message on ``sock``, from a second thread unless ``inline``."""
    loop = new_loop()
    sock.setblocking(False)
    wake = threading.Lock()
    wake.acquire()
    queue: list[bytes] = []

    def answer() -> None:
        while True:
            wake.acquire()  # released by the loop for each message
            sock.send(b"pong" + queue.pop())

    if not inline:
        threading.Thread(target=answer, daemon=True).start()

    def readable() -> None:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return
        if not data:
            loop.stop()
        elif inline:
            sock.send(b"pong" + data)
        else:
            queue.append(data)
            wake.release()

    loop.add_reader(sock.fileno(), readable)
    loop.run_forever()
    os._exit(0)


def run(procs_n: int, calls: int, inline: bool) -> dict[str, Any]:
    socks: list[socket.socket] = []
    pids: list[int] = []
    for _ in range(procs_n):
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            for other in socks:
                other.close()
            serve(theirs, inline)
        theirs.close()
        socks.append(ours)
        pids.append(pid)
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)

    def round_trip() -> None:
        for sock in socks:
            sock.send(b"x")
        left = procs_n
        while left:
            for key, _ in selector.select():
                if not key.fileobj.recv(4096):  # type: ignore[union-attr]
                    raise AssertionError("a floor proc ended")
                left -= 1

    try:
        for _ in range(3):  # prime
            round_trip()
        samples = []
        cpu0 = cpu_seconds(pids)
        for _ in range(calls):
            t0 = time.perf_counter()
            round_trip()
            samples.append(time.perf_counter() - t0)
        cpu = cpu_seconds(pids) - cpu0
    finally:
        for sock in socks:
            sock.close()
        for pid in pids:
            os.waitpid(pid, 0)
    return {
        "procs": procs_n,
        "call_ms": statistics.median(samples) * 1e3,
        "call_ms_samples": [s * 1e3 for s in samples],
        "procs_cpu_us": cpu / calls / procs_n * 1e6,
        "inline": inline,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--procs", type=int, required=True)
    p.add_argument("--calls", type=int, default=30, help="rounds timed")
    p.add_argument("--inline", action="store_true", help="the loop answers (no second thread)")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    return write_result(args.json, lambda: run(args.procs, args.calls, args.inline))


if __name__ == "__main__":
    sys.exit(main())
