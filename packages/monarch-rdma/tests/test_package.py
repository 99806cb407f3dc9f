"""monarch-rdma installs ``monarch.rdma`` into the one ``monarch`` package."""

from __future__ import annotations

import os
from importlib.metadata import requires, version
from pathlib import Path

import monarch
import monarch.rdma


def test_joins_the_monarch_package() -> None:
    assert monarch.rdma.__file__ is not None
    portion = os.path.realpath(Path(monarch.rdma.__file__).parent.parent)
    assert portion in [os.path.realpath(p) for p in monarch.__path__]
    assert (Path(monarch.rdma.__file__).parent / "py.typed").is_file()


def test_depends_on_core_of_the_same_version() -> None:
    assert f"monarch-core=={version('monarch-rdma')}" in (requires("monarch-rdma") or [])
    assert version("monarch-core") == version("monarch-rdma")
