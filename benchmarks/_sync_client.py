"""The controller of ``sync_bench.py``, run as its own process (in a namespace of its own
when the hosts are namespaces): attaches to the workers, times syncs, prints one JSON line.

    python _sync_client.py WORKSPACE REPS ADDR...
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from monarch.actor import attach_to_workers
from monarch.tools.config import Workspace


def timed_sync(hosts: object, workspace: Workspace) -> float:
    start = time.perf_counter()
    hosts.sync_workspace(workspace).get(timeout=600)  # type: ignore[attr-defined]
    return time.perf_counter() - start


def main() -> None:
    src, reps, addresses = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    hosts = attach_to_workers(workers=addresses)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    full, one, none = [], [], []
    for rep in range(reps):
        workspace = Workspace(dirs={src: f"rep{rep}"})  # a new place: everything travels
        full.append(timed_sync(hosts, workspace))
        changed = files[rep % len(files)]
        changed.write_bytes(os.urandom(changed.stat().st_size))
        one.append(timed_sync(hosts, workspace))
        none.append(timed_sync(hosts, workspace))
    print(json.dumps({"full": full, "one_changed": one, "unchanged": none}), flush=True)


if __name__ == "__main__":
    main()
