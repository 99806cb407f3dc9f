"""monarch-tensor installs ``monarch.tensor`` into the one ``monarch`` package, with torch."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

import pytest

import monarch
import monarch.tensor
from monarch.actor import ProcMesh


def test_joins_the_monarch_package() -> None:
    assert monarch.tensor.__file__ is not None
    portion = os.path.realpath(Path(monarch.tensor.__file__).parent.parent)
    assert portion in [os.path.realpath(p) for p in monarch.__path__]
    assert (Path(monarch.tensor.__file__).parent / "py.typed").is_file()


def test_pins_torch_and_core() -> None:
    declared = requires("monarch-tensor") or []
    assert "torch==2.13.0" in declared
    assert f"monarch-core=={version('monarch-tensor')}" in declared
    assert version("torch").split("+")[0] == "2.13.0"


def test_torch_imports_without_the_numpy_warning() -> None:
    """torch warns "Failed to initialize NumPy" at every import without numpy (once per
    proc, and as a red block in every notebook cell that starts one): numpy comes with
    monarch-tensor."""
    assert any(r.startswith("numpy") for r in requires("monarch-tensor") or [])
    done = subprocess.run(
        [sys.executable, "-c", "import torch; torch.ones(1).numpy()"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "NumPy" not in done.stderr, done.stderr


def test_registers_proc_mesh_activate() -> None:
    """The core finds ``ProcMesh.activate`` through this entry point (it never imports torch)."""
    from importlib.metadata import entry_points

    from monarch.tensor import activate

    (found,) = entry_points(group="monarch.tensor_engine", name="activate")
    assert found.load() is activate


def test_activate_looks_its_entry_point_up_once(
    procs: ProcMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading every distribution's metadata costs ~10 ms: an ``activate()`` per step of a
    loop must not pay it again."""
    import importlib.metadata

    with procs.activate():
        pass

    def refuse(**_: object) -> None:
        raise AssertionError("entry points read again")

    monkeypatch.setattr(importlib.metadata, "entry_points", refuse)
    with procs.activate():
        pass
