"""The root ``monarch`` package: namespace joining and lazy top-level names."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import monarch


@pytest.fixture
def no_cached_tensor() -> Iterator[None]:
    """Forget a cached ``monarch.Tensor`` before and after the test."""
    vars(monarch).pop("Tensor", None)
    yield
    vars(monarch).pop("Tensor", None)


def test_missing_layer_names_the_wheel(
    monkeypatch: pytest.MonkeyPatch, no_cached_tensor: None
) -> None:
    monkeypatch.setitem(sys.modules, "monarch.tensor", None)  # as if monarch-tensor were absent
    with pytest.raises(ImportError) as excinfo:
        monarch.Tensor
    # The command that works (the wheels are not on the index yet), from this checkout.
    checkout = Path(monarch.__file__).resolve().parents[4]
    assert str(excinfo.value) == (
        f"monarch.Tensor needs the monarch-tensor wheel: pip install -e "
        f"{checkout}/packages/monarch-tensor (monarch-tensor is not on the package index yet: "
        "the name is reserved for this project)"
    )
    assert excinfo.value.name == "monarch.tensor"


def test_missing_dependency_of_a_present_layer_is_not_masked(
    monkeypatch: pytest.MonkeyPatch, no_cached_tensor: None
) -> None:
    def broken_import(name: str) -> types.ModuleType:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(monarch, "_import_module", broken_import)
    with pytest.raises(ModuleNotFoundError) as excinfo:
        monarch.Tensor
    assert excinfo.value.name == "torch"


def test_present_layer_resolves_and_caches(
    monkeypatch: pytest.MonkeyPatch, no_cached_tensor: None
) -> None:
    fake = types.ModuleType("monarch.tensor")
    sentinel = object()
    fake.Tensor = sentinel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "monarch.tensor", fake)
    assert monarch.Tensor is sentinel
    assert vars(monarch)["Tensor"] is sentinel


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        monarch.no_such_name
    assert not hasattr(monarch, "rdma_buffer")
    with pytest.raises(ImportError):
        from monarch import no_such_name  # noqa: F401


def test_rdma_names_are_not_top_level() -> None:
    for name in ("RDMABuffer", "RDMAAction", "get_rdma_backend"):
        assert not hasattr(monarch, name)


def test_sibling_wheel_joins_the_package() -> None:
    # monarch-transport ships monarch/transport/ but no monarch/__init__.py.
    spec = importlib.util.find_spec("monarch.transport")
    assert spec is not None and spec.submodule_search_locations is not None
    portions = {os.path.realpath(Path(p).parent) for p in spec.submodule_search_locations}
    assert portions <= {os.path.realpath(p) for p in monarch.__path__}
    assert monarch.__file__ is not None
    assert Path(monarch.__file__).name == "__init__.py"
