"""The parameter server example: weights read and gradients written over RDMA buffers by
worker actors give the weights of the same loop run in one process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cloudpickle
import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "parameter_server.py"


@pytest.mark.slow  # three procs import torch: 10-20 s on a loaded machine
@pytest.mark.skipif(not EXAMPLE.exists(), reason="the examples folder is not here")
@pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")
def test_the_parameter_server_matches_one_process() -> None:
    spec = importlib.util.spec_from_file_location("rdma_parameter_server", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the procs cannot import it by name
    assert module.train(size=4096, workers=2, steps=4)
