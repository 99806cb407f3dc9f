"""sync_workspace: a 100 MiB workspace of 1,000 files pushed to 4 hosts, all of it and
then with one file changed.

Run with ``hatch run bench:sync [--reps N] [--out PATH]``. Hosts are ``monarch worker``
processes in network namespaces (the controller in one of its own) when this machine can
make them (root, iproute2), else on loopback; each has its own ``WORKSPACE_DIR``. Figures
(seconds, median of the repetitions): a full sync (to a new directory: every file
travels), a sync after one file changed, and one after nothing changed; the baseline, in
the same run, is copying the workspace to 4 local directories (``shutil.copytree``: what a
full sync cannot beat). Target (issue 20): one changed file costs O(the change), here <=
0.05x the full sync. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# The test helpers that make namespaced hosts (one implementation, shared with the tests).
sys.path.insert(0, str(HERE.parent / "packages" / "monarch-core" / "tests"))

from _results import (  # noqa: E402
    RESULTS_DIR,
    fmt_num,
    machine_info,
    markdown_table,
    ratio_entry,
    summarize,
    write_json,
)
from hostkit import (  # type: ignore[import-not-found]  # noqa: E402
    NetnsUnavailable,
    children,
    network_namespaces,
    start_worker,
)

CLIENT = HERE / "_sync_client.py"
HOSTS = 4
FILES = 1000
TOTAL = 100 << 20


def make_workspace(root: Path) -> None:
    """1,000 files, 100 MiB, in 10 folders."""
    size = TOTAL // FILES
    for i in range(FILES):
        folder = root / f"pkg{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:04}.bin").write_bytes(os.urandom(size))


@contextmanager
def namespaces() -> Iterator[list[str] | None]:
    try:
        with network_namespaces(HOSTS + 1, f"msb{os.getpid() % 100000}") as made:
            yield made
    except NetnsUnavailable as why:
        print(f"no network namespaces ({why}): hosts on loopback", file=sys.stderr)
        yield None


def copy_baseline(src: Path, into: Path, reps: int) -> list[float]:
    times = []
    for rep in range(reps):
        start = time.perf_counter()
        for host in range(HOSTS):
            shutil.copytree(src, into / f"rep{rep}" / f"host{host}")
        times.append(time.perf_counter() - start)
    return times


def run(reps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sync-bench-") as tmp:
        root = Path(tmp)
        src = root / "workspace"
        make_workspace(src)
        env = {**os.environ, "MONARCH_JOB_SECRET": secrets.token_hex(32)}
        with namespaces() as made, children() as start:
            addresses = []
            for i in range(HOSTS):
                netns = made[i + 1] if made else None
                listen = f"tcp://10.0.0.{i + 2}:0" if made else "tcp://127.0.0.1:0"
                worker_env = {**env, "WORKSPACE_DIR": str(root / f"host{i}")}
                addresses.append(start_worker(start, worker_env, listen, netns)[1])
            prefix = ["ip", "netns", "exec", made[0]] if made else []
            argv = [*prefix, sys.executable, str(CLIENT), str(src), str(reps), *addresses]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"the client failed:\n{done.stderr[-3000:]}")
            timings = json.loads(done.stdout.strip().splitlines()[-1])
        copies = copy_baseline(src, root / "copies", reps)
    return {"hosts": "network namespaces" if made else "loopback", **timings, "copy": copies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS_DIR / "sync.json"))
    args = parser.parse_args()
    raw = run(args.reps)
    figures = {k: summarize(raw[k]) for k in ("full", "one_changed", "unchanged", "copy")}
    full, one = figures["full"]["median"], figures["one_changed"]["median"]
    ratios = [
        ratio_entry("one file changed / full sync", 0.05, one, full, higher_is_better=False),
        ratio_entry(
            "full sync / local copies (4 hosts)",
            5.0,
            full,
            figures["copy"]["median"],
            higher_is_better=False,
        ),
    ]
    doc = {
        "benchmark": "sync",
        "machine": machine_info(),
        "settings": {"hosts": HOSTS, "files": FILES, "bytes": TOTAL, "reps": args.reps},
        "where": raw["hosts"],
        "seconds": figures,
        "ratios": ratios,
    }
    path = write_json(args.out, doc)
    rows = [
        [k, fmt_num(v["median"]), fmt_num(v["min"]), fmt_num(v["max"])] for k, v in figures.items()
    ]
    print(markdown_table(["seconds", "median", "min", "max"], rows))
    print()
    print(
        markdown_table(
            ["ratio", "target", "value", "pass"],
            [
                [r["name"], f"{r['op']} {r['target']}", fmt_num(r["ratio"]), r["pass"]]
                for r in ratios
            ],
        )
    )
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
