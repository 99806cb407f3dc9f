"""One in-process A/B of telemetry_bench.py (``--in-process``): ``python _telemetry_ab_client.py
MODE REPS CALLS``. One client, two procs: the first spawned before monarch-telemetry is used
(no instrumentation there), the second after ``install()`` (``api``: the defaults) or
``enable_telemetry()`` (``tables``); the client's hooks are switched with them
(``set_instrumentation``). The two are measured in turn, ``REPS`` times each, alternating
which goes first: both sides of the comparison share the process, the moment and the
machine's load, which separate processes (the other modes) do not. Prints one JSON line:
per side, each rep's round trip, pipelined calls/s and CPU per pipelined call of the
client and of its proc."""

from __future__ import annotations

import json
import sys
from typing import Any

import torch  # noqa: F401 - imported first, as a user's client would
from _telemetry_client import Echo, measure

from monarch.actor import this_host
from monarch.core import current_instrumentation, set_instrumentation


def main(mode: str, reps: int, calls: int) -> None:
    plain = this_host().spawn_procs(per_host={"gpus": 1})
    before = plain.spawn("plain", Echo)
    import monarch.telemetry

    if mode == "tables":
        monarch.telemetry.enable_telemetry()
    elif mode == "api":
        monarch.telemetry.install()
    else:
        raise SystemExit(f"mode: api or tables, not {mode!r}")
    hooks = current_instrumentation()
    used = this_host().spawn_procs(per_host={"gpus": 1})
    after = used.spawn("used", Echo)
    sides: list[tuple[str, Any, Any]] = [("off", before, None), (mode, after, hooks)]
    figures: dict[str, list[dict[str, float]]] = {"off": [], mode: []}
    for rep in range(reps):
        for name, mesh, instrumentation in sides if rep % 2 == 0 else sides[::-1]:
            set_instrumentation(instrumentation)
            figures[name].append(measure(mesh, calls // 4, calls))
    set_instrumentation(hooks)
    plain.stop().get()
    used.stop().get()
    print(json.dumps(figures))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
