"""Monarch's cold start, run by ``core_bench.py`` in a fresh Python process each time.

What a user's script does first: import ``monarch.actor``, spawn one proc and one actor,
and wait for the first reply. Prints one JSON line: ``time.monotonic`` readings (the
parent took its own just before starting this process, on the same clock), then the
RSS of this controller and of the worker after a few more calls, then how long
``stop()`` took.

    python _core_cold_start.py [--torch] [--procs N]

``--torch`` imports torch first, as a PyTorch user's script does (Monarch's procs may then
be asked to have it); ``--procs N`` spawns N procs (``gpus=N``) and times the first reply
of the first.
"""

import time

t_main = time.monotonic()

import json  # noqa: E402 - timed from the very top
import os  # noqa: E402
import sys  # noqa: E402

if "--torch" in sys.argv:
    import torch  # noqa: F401 - the import is the point

from monarch.actor import Actor, endpoint, this_host  # noqa: E402

t_imported = time.monotonic()


class Echo(Actor):
    @endpoint
    def ping(self) -> None:
        return None

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def rss_kib(pid: int | str = "self") -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def main() -> None:
    t_spawn = time.monotonic()
    count = int(sys.argv[sys.argv.index("--procs") + 1]) if "--procs" in sys.argv else 1
    procs = this_host().spawn_procs(per_host={"gpus": count})
    actor = procs.spawn("echo", Echo).slice(gpus=0)
    pid = actor.pid.call_one().get(timeout=60)
    t_reply = time.monotonic()
    for _ in range(3):
        actor.ping.call_one().get(timeout=60)
    doc = {
        "t_main": t_main,
        "t_imported": t_imported,
        "t_spawn": t_spawn,
        "t_reply": t_reply,
        "controller_rss": rss_kib(),
        "worker_rss": rss_kib(pid),
    }
    t_stop = time.monotonic()
    procs.stop().get(timeout=60)
    doc["stop_s"] = time.monotonic() - t_stop
    print(json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
