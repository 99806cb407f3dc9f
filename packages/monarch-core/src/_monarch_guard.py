"""Noticing upstream's torchmonarch in the same environment as this project's ``monarch``.

Both install a ``monarch`` package and a ``monarch`` command: whichever pip installed last
overwrites the other's files, or (an editable install of this project) upstream's package
shadows this one, so that none of this project's code runs to say so. This module is
outside the ``monarch`` package, where upstream's files cannot replace it, and
monarch-core's ``monarch_core_guard.pth`` imports it when Python starts: it only puts a
finder first on ``sys.meta_path`` (microseconds). When ``monarch`` is first imported, the
finder looks for a file of upstream's package beside this project's (a stat per
``sys.path`` entry), warns once if there is one, and steps aside.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing's: importing it would cost every Python here ~7 ms
if TYPE_CHECKING:  # this runs as every Python of the environment starts: nothing more
    from collections.abc import Iterable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Final

UPSTREAM: Final = "torchmonarch"
MARK: Final = ("monarch", "bootstrap_main.py")
"""A file of torchmonarch's ``monarch`` package that this project's does not have."""


def upstream_monarch(paths: Iterable[str]) -> str | None:
    """The folder of upstream's ``monarch`` package among ``paths``' entries, if any."""
    for path in paths:
        if os.path.isfile(os.path.join(path or ".", *MARK)):
            return os.path.join(path, MARK[0])
    return None


def warning(where: str) -> str:
    """What to tell a user whose environment has upstream's torchmonarch beside this project."""
    return (
        f"upstream's {UPSTREAM} is installed in this environment too ({where}): it and this "
        "project both install the `monarch` package and command, and whichever was installed "
        "last has overwritten (or shadows) the other's files. Use one per environment: pip "
        f"uninstall {UPSTREAM}, then reinstall this project's wheels (or give upstream a "
        "virtualenv of its own)."
    )


class _FirstImport:
    """First on ``sys.meta_path`` until ``monarch`` is imported: then warns, if need be."""

    @classmethod
    def find_spec(
        cls, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "monarch":
            if cls in sys.meta_path:
                sys.meta_path.remove(cls)
            where = upstream_monarch(sys.path)
            if where is not None:
                import warnings

                warnings.warn(warning(where), RuntimeWarning, stacklevel=2)
        return None


def install() -> None:
    """Called by monarch_core_guard.pth as Python starts."""
    if "monarch" not in sys.modules and _FirstImport not in sys.meta_path:
        sys.meta_path.insert(0, _FirstImport)
