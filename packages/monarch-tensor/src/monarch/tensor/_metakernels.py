"""torch's meta kernels on the controller without importing ``torch._dynamo``.

torch 2.13 runs most ops on meta tensors through Python decompositions (its
``_meta_registrations.activate_meta`` registers them over the C++ meta kernels), and wraps
each elementwise one in ``torch._disable_dynamo``, whose first call imports ``torch._dynamo``
(about 1 s here, sympy among it) to build the disabled function. The controller runs every
op on meta tensors, so its first ``t + 1`` paid that import.

While ``torch._dynamo`` is not imported no frame runs under it, and the disabled function
is the function itself: ``spare_dynamo()`` gives each wrapper of those kernels that answer
(the attribute ``torch._compile`` caches it in). The import of ``torch._dynamo`` (a user's
``torch.compile``, say) takes it back before dynamo's first line runs, so torch's own
wrappers apply from then on. The kernels run unchanged either way.

sympy itself is still imported by the first elementwise op: torch's
``_prims_common.elementwise_dtypes`` imports it on every call (about 0.3 s, once).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterable, Sequence
from importlib.machinery import ModuleSpec
from typing import Any

import torch
import torch._compile
import torch._decomp

_ATTRIBUTE = "__dynamo_disable"  # where torch._compile._disable_dynamo caches its function
_DYNAMO = "torch._dynamo"
_MODULES = ("torch._refs", "torch._prims", "torch._decomp", "torch._meta_registrations")

_lock = threading.Lock()
_done = threading.Event()
_spared: list[Callable[..., Any]] = []


def spare_dynamo() -> None:
    """Let torch's meta kernels run without importing ``torch._dynamo`` (once per process;
    nothing where it is imported already)."""
    if _done.is_set():
        return
    with _lock:
        if not _done.is_set() and _DYNAMO not in sys.modules:
            _spare()
        _done.set()


def _spare() -> None:
    wrapper_code = torch._compile._disable_dynamo(_probe).__code__
    roots: list[object] = []
    for table in torch._decomp.global_decomposition_table.values():
        roots.extend(table.values())
    for name in [name for name in list(sys.modules) if name.startswith(_MODULES)]:
        module = sys.modules.get(name)  # None for a failed import
        if module is not None:
            roots.extend(vars(module).values())
    for fn in _wrapped(roots, wrapper_code):
        if getattr(fn, _ATTRIBUTE, None) is None:
            setattr(fn, _ATTRIBUTE, fn)
            _spared.append(fn)
    sys.meta_path.insert(0, _GiveBack())


def _probe() -> None:
    """A function to wrap, for the wrapper's code object."""


def _wrapped(roots: Iterable[object], wrapper_code: types.CodeType) -> list[Callable[..., Any]]:
    """The functions that ``_disable_dynamo`` wrappers reachable from ``roots`` call (through
    ``__wrapped__`` chains and closures, as torch's decorators nest them)."""
    seen: set[int] = set()
    found: list[Callable[..., Any]] = []
    stack = [root for root in roots if isinstance(root, types.FunctionType)]
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn.__code__ is wrapper_code:  # its ``fn`` (``__wrapped__`` may name another)
            cell = fn.__closure__[wrapper_code.co_freevars.index("fn")] if fn.__closure__ else None
            if cell is not None and callable(cell.cell_contents):
                found.append(cell.cell_contents)
        nested = [getattr(fn, "__wrapped__", None)]
        for cell in fn.__closure__ or ():
            try:
                nested.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        stack.extend(x for x in nested if isinstance(x, types.FunctionType))
    return found


def _give_back() -> None:
    """torch's own wrappers from now on (``torch._dynamo`` is being imported)."""
    for fn in _spared:
        if vars(fn).get(_ATTRIBUTE) is fn:
            delattr(fn, _ATTRIBUTE)
    _spared.clear()


class _GiveBack:
    """An import hook that sees ``torch._dynamo``'s import start, gives the wrappers back and
    leaves (it finds nothing itself)."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == _DYNAMO:
            _give_back()
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        return None
