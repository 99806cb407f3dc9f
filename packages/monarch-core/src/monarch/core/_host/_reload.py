"""Reloading the modules whose files changed, in a running process (``auto_reload``).

After ``sync_workspace(..., auto_reload=True)`` wrote new files on the hosts, each proc
reloads the modules it loaded from the files that changed (the sync knows which: it sent
them), as upstream's ``AutoReloader`` does for files whose mtime changed. Reloading alone
would leave live objects on the old code: an actor is an instance of the old class, and
``from mod import f`` holds the old function. So the old classes and functions are
updated in place from the new module (a function takes the new code; a class, the new
attributes), as IPython's autoreload does: the next call to an actor that exists runs the
new code.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class Reloader:
    """The synced directories of a proc, on its ``sys.path``; reloading modules by file."""

    def __init__(self) -> None:
        self.roots: set[Path] = set()

    def watch(self, root: Path) -> None:
        """Put ``root`` first on ``sys.path``, so that this process imports the synced code."""
        root = root.resolve()
        self.roots.add(root)
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        importlib.invalidate_caches()

    def reload_files(self, paths: Iterable[Path]) -> list[str]:
        """Reload the modules loaded from ``paths`` (files that changed); their names, in
        the order they were first imported.

        A module that fails to reload keeps its old code, and the error is raised once the
        others were reloaded.
        """
        changed = {str(Path(p).resolve()) for p in paths}
        importlib.invalidate_caches()
        reloaded: list[str] = []
        failed: list[tuple[str, BaseException]] = []
        for name, module in list(sys.modules.items()):
            filename = getattr(module, "__file__", None)
            if not isinstance(filename, str) or str(Path(filename).resolve()) not in changed:
                continue
            old = dict(module.__dict__)
            try:
                importlib.reload(module)
            except Exception as exc:  # noqa: BLE001 - reported below, the others go on
                failed.append((name, exc))
                continue
            update_in_place(old, module.__dict__)
            reloaded.append(name)
        if failed:
            name, error = failed[0]
            raise ImportError(f"reloading {name} failed: {error!r}") from error
        return reloaded


def update_in_place(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Make the old functions and classes of a module run its new code.

    The module keeps the old objects, updated: the next reload updates them again, and so
    the live objects (an actor is an instance of the class as first loaded).
    """
    for name, before in old.items():
        after = new.get(name)
        if after is None or after is before:
            continue
        if isinstance(before, types.FunctionType) and isinstance(after, types.FunctionType):
            update_function(before, after)
            new[name] = before  # one object, old references and new alike
        elif (
            isinstance(before, type)
            and isinstance(after, type)
            and (before.__module__, before.__qualname__) == (after.__module__, after.__qualname__)
        ):
            update_class(before, after)
            new[name] = before


def update_function(old: types.FunctionType, new: types.FunctionType) -> None:
    """Give ``old`` the code of ``new`` (when their closures allow, else leave it)."""
    try:
        old.__code__ = new.__code__
    except ValueError:  # a different number of free variables
        return
    old.__defaults__ = new.__defaults__
    old.__kwdefaults__ = new.__kwdefaults__
    old.__dict__.update(new.__dict__)
    old.__doc__ = new.__doc__
    old.__annotations__ = new.__annotations__


_FIXED = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__"})


def update_class(old: type, new: type) -> None:
    """Give ``old`` the attributes of ``new``: methods take the new code, so instances of
    ``old`` (live actors) run it; attributes the new class dropped are removed."""
    for name in list(old.__dict__):
        if name not in new.__dict__ and name not in _FIXED:
            try:
                delattr(old, name)
            except (AttributeError, TypeError):
                pass
    for name, after in new.__dict__.items():
        if name in _FIXED:
            continue
        before = old.__dict__.get(name)
        function_before = _function_in(before)
        function_after = _function_in(after)
        if function_before is not None and function_after is not None:
            update_function(function_before, function_after)
            if type(before) is type(after):
                _copy_options(before, after)
                continue
        try:
            setattr(old, name, after)
        except (AttributeError, TypeError):
            pass


def _function_in(value: Any) -> types.FunctionType | None:
    """The function a method, a static/class method or an endpoint holds."""
    if isinstance(value, types.FunctionType):
        return value
    inner = getattr(value, "__func__", None) or getattr(value, "_method", None)
    return inner if isinstance(inner, types.FunctionType) else None


def _copy_options(before: Any, after: Any) -> None:
    """An endpoint's options (``propagate``, ...) and signature come with its new code."""
    if hasattr(before, "_method") and hasattr(after, "__dict__"):
        method = before._method
        before.__dict__.update(after.__dict__)
        before._method = method
