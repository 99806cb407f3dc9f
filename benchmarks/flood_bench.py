"""A flood of unauthenticated connections against a listener and against a job's client.

What an attacker on the same network can do without the secret: open connections and send
nothing (``--idle``), or trickle one byte a second (``--slow``, a slowloris). Measured with
and without the flood, in the same run:

* ``handshake``: a peer with the right secret connects to a listener (a process of its own,
  default options) and gets one frame echoed back;
* ``spawn``: a job's client (torch imported first) spawns 2 procs and gets the first reply
  from an actor on them, while its own listener is flooded (the procs dial it to report);
* ``closed``: how long until the listener has closed every idle flood connection (its
  deadline for a handshake's first bytes), and how many it holds open at most.

The flood comes from a process of its own (``flood`` subcommand), with its descriptor limit
raised to the hard limit. ``--client-nofile 1024`` runs the job's client with that soft limit,
as a default ``ulimit -n`` would. Nothing is asserted: it writes one JSON result::

    python benchmarks/flood_bench.py --idle 1000 10000 --slow 200
"""

from __future__ import annotations

import argparse
import math
import resource
import select
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _results import RESULTS_DIR, machine_info, write_json  # noqa: E402

SECRET = b"flood-bench-secret-0123456789"

LISTENER = """
import anyio, sys
from monarch.transport import open_listener

async def main():
    listener = await open_listener(sys.argv[1], secret=bytes.fromhex(sys.argv[2]))
    print(listener.address, flush=True)

    async def echo(conn):
        async for frame in conn:
            await conn.send(frame)

    await listener.serve(echo)

anyio.run(main)
"""


def _connect_raw(address: str) -> socket.socket:
    scheme, _, rest = address.partition("://")
    if scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        sock.connect("\0" + rest[1:] if rest.startswith("@") else rest)
        return sock
    host, _, port = rest.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=5.0)


def flood(address: str, idle: int, slow: int) -> None:
    """Open ``idle`` silent and ``slow`` trickling connections to ``address``, print
    ``ready``, hold them until a line (or EOF) on stdin (trickling a byte a second on the
    slow ones), then print how many the listener had closed and when."""
    from monarch.transport.wire import Handshake

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    start = time.monotonic()
    socks = []
    for _ in range(idle + slow):
        try:
            socks.append(_connect_raw(address))
        except OSError as exc:  # the backlog full: the kernel drops our SYN
            print(f"connect failed after {len(socks)}: {exc}", file=sys.stderr)
            break
    print(f"opened {len(socks)}", file=sys.stderr)
    for sock in socks:
        sock.setblocking(False)
    print("ready", flush=True)
    open_ = set(range(len(socks)))
    closed_at: list[float] = []
    slow_ones = set(range(idle, len(socks)))
    # a genuine client's first bytes (magic, hello), a byte a second: never malformed
    trickle = Handshake("client", b"not-the-secret-0123456789").data_to_send()
    sent = dict.fromkeys(slow_ones, 0)
    next_byte = time.monotonic()
    while open_ and not select.select([sys.stdin], [], [], 0)[0]:
        now = time.monotonic()
        for i in list(open_):
            try:
                if socks[i].recv(4096) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                continue
            except OSError:
                open_.discard(i)
                closed_at.append(now - start)
        if now >= next_byte:
            next_byte = now + 1.0
            for i in slow_ones & open_:
                try:
                    socks[i].send(trickle[sent[i] % len(trickle) : sent[i] % len(trickle) + 1])
                    sent[i] += 1
                except OSError:
                    open_.discard(i)
                    closed_at.append(now - start)
        time.sleep(0.05)
    print(
        f"closed {len(socks) - len(open_)} of {len(socks)}; "
        f"last at {max(closed_at, default=0):.2f}s",
        flush=True,
    )
    for sock in socks:
        sock.close()


def start_flood(address: str, idle: int, slow: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "flood", address, str(idle), str(slow)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError(f"the flood did not start: {line!r}")
    return proc


def end_flood(proc: subprocess.Popen[str], wait: float = 0.0) -> str:
    """What the flood saw; it is given ``wait`` seconds to see all its connections closed
    (it then ends by itself) before it is stopped."""
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        pass
    out, _ = proc.communicate("stop\n" if proc.returncode is None else None, timeout=120)
    return out.strip()


def handshakes(address: str, repeat: int) -> list[float]:
    """Seconds for ``repeat`` fresh authenticated connections, each with one echo."""
    import anyio

    from monarch.transport import TransportError, open_connection

    async def main() -> list[float]:
        times = []
        for _ in range(repeat):
            begin = time.perf_counter()
            try:
                with anyio.fail_after(120):
                    conn = await open_connection(address, secret=SECRET)
                    await conn.send([b"ping"])
                    await conn.receive()
            except (OSError, TimeoutError, TransportError) as exc:
                print(f"handshake failed after {time.perf_counter() - begin:.1f}s: {exc}")
                times.append(math.inf)
                continue
            times.append(time.perf_counter() - begin)
            await conn.aclose()
        return times

    return anyio.run(main)


SPAWN = """
import sys, time, json
import torch  # noqa: F401 - as users run
from monarch.actor import Actor, endpoint, this_host
from monarch.core import current_runtime

class A(Actor):
    @endpoint
    def ping(self):
        return 1

address = current_runtime().address
print(address, flush=True)
sys.stdin.readline()  # the flood is up
begin = time.perf_counter()
procs = this_host().spawn_procs(per_host={"gpus": 2})
actors = procs.spawn("a", A)
actors.ping.call().get(timeout=300)
print(json.dumps({"spawn": time.perf_counter() - begin}), flush=True)
procs.stop().get(timeout=60)
"""


def spawn_under(idle: int, slow: int, nofile: int | None) -> dict[str, Any]:
    def limit() -> None:
        if nofile is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))

    client = subprocess.Popen(
        [sys.executable, "-c", SPAWN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    assert client.stdin is not None and client.stdout is not None
    address = client.stdout.readline().strip()
    flooder = start_flood(address, idle, slow) if idle + slow else None
    client.stdin.write("go\n")
    client.stdin.flush()
    try:
        out, err = client.communicate(timeout=300)
    finally:
        flood_said = end_flood(flooder) if flooder is not None else ""
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if client.returncode or not lines:
        return {"error": f"rc {client.returncode}: {err.strip().splitlines()[-3:]}"}
    import json

    return {**json.loads(lines[-1]), "flood": flood_said}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--client-nofile", type=int, default=1024)
    parser.add_argument("--transport", default="tcp://127.0.0.1:0")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    listener = subprocess.Popen(
        [sys.executable, "-c", LISTENER, args.transport, SECRET.hex()],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert listener.stdout is not None
    address = listener.stdout.readline().strip()
    results: dict[str, Any] = {"handshake_s": {}, "spawn_s": {}, "flood": {}}
    try:
        cases = [(0, 0)] + [(n, 0) for n in args.idle] + [(0, args.slow)]
        for idle, slow in cases:
            name = f"idle={idle},slow={slow}"
            flooder = start_flood(address, idle, slow) if idle + slow else None
            times = handshakes(address, args.repeat)
            results["handshake_s"][name] = {
                "median": _finite(statistics.median(times)),
                "max": _finite(max(times)),
                "failed": sum(math.isinf(t) for t in times),
                "all": [t if math.isfinite(t) else None for t in times],
            }
            if flooder is not None:
                results["flood"][name] = end_flood(flooder, wait=15.0)
            print(name, "handshake median", f"{statistics.median(times) * 1e3:.1f} ms", flush=True)
        for idle, slow in [(0, 0), *((n, 0) for n in args.idle), (0, args.slow)]:
            name = f"idle={idle},slow={slow},nofile={args.client_nofile}"
            results["spawn_s"][name] = spawn_under(idle, slow, args.client_nofile)
            print(name, results["spawn_s"][name], flush=True)
    finally:
        listener.kill()
        listener.wait()
    document = {"benchmark": "flood", "machine": machine_info(), "settings": vars(args), **results}
    path = write_json(args.output or RESULTS_DIR / "flood.json", document)
    print("wrote", path)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "flood":
        flood(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
