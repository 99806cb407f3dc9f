"""Monarch: single-controller distributed programming for PyTorch, in Python.

This file ships only in the monarch-core wheel. It makes every installed Monarch wheel (and every
editable checkout) contribute to this one ``monarch`` package, and resolves upstream Monarch's
top-level names lazily, so ``import monarch`` stays cheap and never imports torch.
"""

from __future__ import annotations

import pkgutil as _pkgutil
from importlib import import_module as _import_module
from typing import Any as _Any

# Sibling wheels ship monarch/<layer>/ without a monarch/__init__.py; when they live in other
# sys.path entries (editable installs) this adds their monarch/ directories to the package.
__path__ = _pkgutil.extend_path(__path__, __name__)

from monarch import _wheels

_wheels.install_finder()  # `import monarch.job` without monarch-jobs says how to install it

# Upstream's lazy top-level names -> (module that provides it, attribute in that module).
_LAZY: dict[str, tuple[str, str]] = {
    # monarch-core
    **{
        name: ("monarch.config", name)
        for name in (
            "configure",
            "configured",
            "get_global_config",
            "get_runtime_config",
            "clear_runtime_config",
        )
    },
    "Extent": ("monarch.actor", "Extent"),
    "Shape": ("monarch.actor", "Shape"),
    "NDSlice": ("monarch.actor", "NDSlice"),
    "Selection": ("monarch.actor", "Selection"),
    "LocalAllocator": ("monarch.actor", "LocalAllocator"),
    "ProcessAllocator": ("monarch.actor", "ProcessAllocator"),
    # monarch-tensor
    **{
        name: ("monarch.tensor", name)
        for name in (
            "Tensor",
            "remote",
            "fetch_shard",
            "inspect",
            "show",
            "call_on_shard_and_fetch",
            "reduce",
            "reduce_",
            "to_mesh",
            "slice_mesh",
            "Stream",
            "get_active_stream",
            "get_active_mesh",
            "no_mesh",
            "coalescing",
            "DeviceMesh",
            "RemoteProcessGroup",
            "Future",
            "RemoteException",
            "OpaqueRef",
            "Pipe",
            "create_pipe",
            "remote_generator",
            "function_resolvers",
            "grad_function",
            "grad_generator",
            "python_local_mesh",
            "Simulator",
            "set_meta",
            "world_mesh",
            "timer",
            "builtins",
        )
    },
}

# Module of a layer -> the wheel that ships it.
_WHEEL: dict[str, str] = {
    "monarch.actor": "monarch-core",
    "monarch.config": "monarch-core",
    "monarch.tensor": "monarch-tensor",
}


def __getattr__(name: str) -> _Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise  # the layer is there but one of its own imports is missing
        wheel = _WHEEL[module_name]
        raise ImportError(
            f"monarch.{name} needs the {wheel} wheel: {_wheels.install_hint(wheel)}",
            name=module_name,
        ) from e
    value = getattr(module, attribute)
    globals()[name] = value
    return value
