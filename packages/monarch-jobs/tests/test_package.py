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
