"""The tensor engine's cold start, run by ``start_bench.py`` in a fresh Python each time.

A PyTorch user's script: ``import torch`` and ``monarch``, ``spawn_procs(gpus=2)``, wait
for ``initialized``, then the first value: a tensor made on the mesh and fetched back
(upstream's API only, so that upstream 0.7.0's interpreter runs it too). Prints one JSON
line of ``time.monotonic`` readings.

    python _tensor_cold_start.py [--work SECONDS]

``--work``: the script's own work between its imports and the spawn (a model built, data
loaded: here torch matrix products on the client for that long), as most scripts have.
"""

import time

t_main = time.monotonic()

import json  # noqa: E402 - timed from the very top
import sys  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402

import monarch  # noqa: E402
from monarch.actor import this_host  # noqa: E402

warnings.simplefilter("ignore")


def work(seconds: float) -> None:
    """The script's own work: torch on the client, for ``seconds``."""
    a = torch.rand(256, 256)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


def main() -> None:
    if "--work" in sys.argv:
        work(float(sys.argv[sys.argv.index("--work") + 1]))
    t_spawn = time.monotonic()
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    procs.initialized.get(timeout=120)
    t_initialized = time.monotonic()
    with procs.activate():
        t = torch.full((4, 4), 3.0)
    value = monarch.fetch_shard(t, gpus=1).get(timeout=120)
    t_value = time.monotonic()
    if not torch.equal(value, torch.full((4, 4), 3.0)):
        raise AssertionError(f"first value {value}")
    print(
        json.dumps(
            {
                "t_main": t_main,
                "t_spawn": t_spawn,
                "t_initialized": t_initialized,
                "t_value": t_value,
            }
        ),
        flush=True,
    )
    procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()
