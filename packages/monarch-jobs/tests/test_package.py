"""monarch-jobs installs ``monarch.job`` and ``monarch.spmd`` into the one ``monarch`` package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import monarch


@pytest.mark.parametrize("name", ["job", "spmd"])
def test_joins_the_monarch_package(name: str) -> None:
    module = __import__(f"monarch.{name}", fromlist=["__name__"])
    assert module.__file__ is not None
    portion = os.path.realpath(Path(module.__file__).parent.parent)
    assert portion in [os.path.realpath(p) for p in monarch.__path__]
    assert (Path(module.__file__).parent / "py.typed").is_file()


def test_scheduler_clients_are_optional() -> None:
    code = "import sys, monarch.job, monarch.spmd; print('kubernetes' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_every_public_name_imports_and_dir_lists_it() -> None:
    import monarch.job

    for name in monarch.job.__all__:
        assert getattr(monarch.job, name) is not None
        assert name in dir(monarch.job)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = monarch.job.Nope


def test_a_local_worker_starts_without_the_client_side_or_plugin_discovery() -> None:
    """ProcessJob's workers (``python -m monarch.core.worker``, or forked by ``python -m
    monarch.job._fork``) import neither the job classes nor importlib.metadata: each costs
    a worker's start for nothing."""
    code = (
        "import sys, monarch.core.worker, monarch.job._fork, monarch.core as c; "
        "c.import_proc_start(); "
        "print(sorted(m for m in ('monarch.job._process', 'monarch.job._exec', "
        "'importlib.metadata') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    usage = subprocess.run(
        [sys.executable, "-m", "monarch.core.worker", "--help"], capture_output=True, text=True
    )
    assert usage.returncode == 0 and "--listen ADDR" in usage.stdout
