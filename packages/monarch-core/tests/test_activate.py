"""``ProcMesh.activate()`` is monarch-tensor's, found through an entry point: without that
wheel it is an ImportError that names it (the core itself never imports torch)."""

from __future__ import annotations

import importlib.util

import pytest

from monarch.actor import Actor, endpoint, this_proc


@pytest.mark.skipif(
    importlib.util.find_spec("monarch.tensor") is not None,
    reason="monarch-tensor is installed here (its own tests cover activate())",
)
def test_activate_without_the_tensor_wheel_names_it() -> None:
    with pytest.raises(ImportError, match=r"pip install -e \S+/packages/monarch-tensor \("):
        this_proc().activate()


@pytest.mark.skipif(
    importlib.util.find_spec("monarch.tensor") is not None,
    reason="monarch-tensor is installed here (its own tests cover rank_tensor())",
)
def test_rank_tensors_without_the_tensor_wheel_name_it() -> None:
    with pytest.raises(ImportError, match=r"rank_tensor\(\) needs the monarch-tensor wheel"):
        this_proc().rank_tensor("gpus")
    with pytest.raises(ImportError, match=r"rank_tensors\(\) needs the monarch-tensor wheel"):
        this_proc().rank_tensors()


class _Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x


@pytest.mark.skipif(
    importlib.util.find_spec("monarch.tensor") is not None,
    reason="monarch-tensor is installed here (its own tests cover rref())",
)
def test_rref_without_the_tensor_wheel_names_it() -> None:
    echo = this_proc().spawn("rref_echo", _Echo)
    with pytest.raises(ImportError, match=r"Endpoint.rref\(\) needs the monarch-tensor wheel"):
        echo.echo.rref(1)
