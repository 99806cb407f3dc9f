"""Upstream's ``monarch.tools.config``: ``Workspace``, the scheduler ``Config``, ``NOT_SET``.

``Config`` is the dataclass upstream's ``monarch.tools.commands`` take. Its default ``appdef`` is an
empty torchx ``AppDef``, so, as upstream's, ``Config()`` needs torchx unless ``appdef`` is given.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from monarch.core._mesh._workspace import Workspace

__all__ = ["NOT_SET", "Config", "Workspace"]

NOT_SET: str = "__NOT_SET__"
"""Upstream's marker for a field left unset (``Config.scheduler``, an empty ``AppDef``'s name)."""


def _empty_appdef() -> Any:
    try:
        specs = import_module("torchx.specs")  # optional: by name, so nothing needs its stubs
    except ModuleNotFoundError as error:
        if error.name is None or not error.name.startswith("torchx"):
            raise
        raise ModuleNotFoundError(
            "No module named 'torchx': Config()'s default appdef is a torchx AppDef; "
            "pip install torchx, or pass appdef=",
            name="torchx",
        ) from error
    return specs.AppDef(name=NOT_SET)


@dataclass
class Config:
    """What scheduling a mesh of hosts needs (upstream's fields, defaults and coercions).

    ``workspace`` given as ``None``/``""`` or as a directory string is upstream's deprecated form:
    it warns (``FutureWarning``) and becomes ``Workspace.null()`` or ``Workspace(dirs={d: ""})``.
    """

    scheduler: str = NOT_SET
    scheduler_args: dict[str, Any] = field(default_factory=dict)
    workspace: Workspace = field(default_factory=Workspace.null)
    dryrun: bool = False
    appdef: Any = field(default_factory=_empty_appdef)

    def __post_init__(self) -> None:
        given: object = self.workspace
        if given is None or given == "":
            warnings.warn(
                "Setting `workspace=None` is deprecated. Use "
                "`workspace=monarch.tools.config.workspace.Workspace(env=None)` instead.",
                FutureWarning,
                stacklevel=3,
            )
            self.workspace = Workspace.null()
        elif isinstance(given, str):
            warnings.warn(
                f"Setting `workspace='{given}'` is deprecated. Use "
                f"`workspace=monarch.tools.config.workspace.Workspace(dirs=['{given}'])` instead.",
                FutureWarning,
                stacklevel=3,
            )
            self.workspace = Workspace(dirs={given: ""})
