"""Which wheel of this project ships what, and the command that installs it today.

The wheels' names (monarch-core, monarch-jobs, pymonarch...) are reserved for this project
but not on the package index yet: ``pip install monarch-jobs`` finds nothing. Every hint
of a missing wheel (``install_hint``) gives the command that works, from a checkout of
this repository, with the siblings it needs that are not installed. ``MissingWheelFinder``
turns ``import monarch.job`` in a core-only install into an error that says so, and
``upstream_installed`` notices upstream's package installed with this one (for ``monarch
version``; ``_monarch_guard`` warns at import).

Imported by ``monarch/__init__.py``: standard library only, nothing costly at import.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Final

from _monarch_guard import UPSTREAM, upstream_monarch, warning

if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

SIBLINGS: Final[dict[str, tuple[str, ...]]] = {
    "monarch-transport": (),
    "monarch-core": ("monarch-transport",),
    "monarch-rdma": ("monarch-core",),
    "monarch-tensor": ("monarch-core",),
    "monarch-telemetry": ("monarch-core",),
    "monarch-admin": ("monarch-core",),
    "monarch-jobs": ("monarch-core",),  # telemetry and admin: its extras
}
"""Each wheel's sibling wheels it depends on (its pyproject.toml's, checked by a test)."""

COMMANDS: Final[dict[str, str]] = {
    **dict.fromkeys(("top", "tui", "dashboard", "query", "trace", "profile"), "monarch-admin"),
    **dict.fromkeys(("apply", "exec", "kill", "shell"), "monarch-jobs"),
}
"""The sibling wheel that adds each ``monarch`` subcommand outside monarch-core's."""

MODULES: Final[dict[str, str]] = {
    "monarch.transport": "monarch-transport",
    "monarch.rdma": "monarch-rdma",
    "monarch.tensor": "monarch-tensor",
    "monarch.telemetry": "monarch-telemetry",
    "monarch.admin": "monarch-admin",
    "monarch.job": "monarch-jobs",
    "monarch.spmd": "monarch-jobs",
}
"""The sibling wheel that ships each ``monarch`` subpackage outside monarch-core."""


def _checkout() -> str | None:
    """The checkout this monarch-core runs from (an editable install), else None."""
    root = os.path.realpath(__file__)  # <checkout>/packages/monarch-core/src/monarch/_wheels.py
    for _ in range(5):
        root = os.path.dirname(root)
    if os.path.isfile(os.path.join(root, "packages", "monarch-core", "pyproject.toml")):
        return root
    return None


def _installed(wheel: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution  # on use: ~20 ms

    try:
        distribution(wheel)
    except PackageNotFoundError:
        return False
    return True


def _closure(wheel: str) -> list[str]:
    """``wheel`` and the siblings it needs, dependencies first."""
    order: list[str] = []

    def visit(name: str) -> None:
        for sibling in SIBLINGS.get(name, ()):
            visit(sibling)
        if name not in order:
            order.append(name)

    visit(wheel)
    return order


def install_hint(wheel: str, extras: str = "") -> str:
    """The command that installs ``wheel`` (``[extras]`` too) here, with the siblings it
    needs that are missing; the index has none of them yet."""
    needed = [name for name in _closure(wheel) if name == wheel or not _installed(name)]
    root = _checkout()
    if root is not None:  # this checkout, editable as the rest
        folders = [os.path.join(root, "packages", name) for name in needed]
        where, editable = "", "-e "
    else:
        folders = [f"./packages/{name}" for name in needed]
        where, editable = "from a checkout of this repository: ", ""
    if extras:
        folders[-1] = f"{folders[-1]}[{extras}]"
    command = " ".join(f'{editable}"{folder}"' if "[" in folder else f"{editable}{folder}"
                       for folder in folders)  # fmt: skip
    return (
        f"{where}pip install {command} ({wheel} is not on the package index yet: the name is "
        "reserved for this project)"
    )


def missing_wheel_message(module: str) -> str:
    """The error for ``import module`` where its wheel is not installed."""
    wheel = MODULES[module]
    return f"No module named {module!r}: it ships in the {wheel} wheel; {install_hint(wheel)}"


class MissingWheelFinder:
    """Last on ``sys.meta_path``: an ``import`` of a subpackage of a wheel that is not
    installed fails saying which wheel and how to install it. A probe
    (``importlib.util.find_spec``) still gets None, as without this finder."""

    @classmethod
    def find_spec(
        cls, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in MODULES:
            return None
        # The import statement's _find_and_load_unlocked -> _find_spec -> here; a probe's
        # importlib.util.find_spec -> _find_spec -> here.
        caller = sys._getframe(2).f_code.co_name
        if caller != "_find_and_load_unlocked":
            return None
        raise ModuleNotFoundError(missing_wheel_message(fullname), name=fullname)


def install_finder() -> None:
    if not any(finder is MissingWheelFinder for finder in sys.meta_path):
        sys.meta_path.append(MissingWheelFinder)


def upstream_installed() -> str | None:
    """What to say when upstream's torchmonarch is installed on ``sys.path`` (its metadata,
    or its files in a ``monarch`` package: see ``_monarch_guard``), else None."""
    from importlib.metadata import PackageNotFoundError, distribution  # on use: ~20 ms

    try:
        found = distribution(UPSTREAM)
    except PackageNotFoundError:
        where = upstream_monarch(sys.path)
    else:
        where = f"{UPSTREAM} {found.version} in {found.locate_file('')}"
    return None if where is None else warning(where)
