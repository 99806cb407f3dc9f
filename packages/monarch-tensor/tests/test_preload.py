"""Procs start with the tensor engine imported, once their host's zygote has preloaded it
(``proc_preload`` "auto", the client having imported monarch.tensor): a fresh mesh's first
tensor command then spawns its worker without importing this wheel (0.3-0.4 s a proc)."""

from __future__ import annotations

import time
from typing import cast

import programs
import torch

from monarch.actor import this_host
from monarch.tensor import Tensor, fetch_shard

WAIT = 60.0


def test_procs_forked_once_the_zygote_is_ready_have_the_engine_imported() -> None:
    deadline = time.monotonic() + 60.0
    while True:  # the first procs are forked at once, before the zygote has imported it
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            probe = procs.spawn("probe", programs.Modules)
            if probe.had.call_one("monarch.tensor._worker").get(timeout=WAIT):
                with procs.activate():
                    t = cast(Tensor, torch.ones(2)).reduce("gpus", "sum")
                assert fetch_shard(t).get(timeout=WAIT).tolist() == [1.0, 1.0]
                return
        finally:
            procs.stop().get(timeout=WAIT)
        assert time.monotonic() < deadline, "no proc came with monarch.tensor preloaded"
