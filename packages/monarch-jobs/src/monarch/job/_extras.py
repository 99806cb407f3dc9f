"""The wheels a job uses only when asked (telemetry, the admin server): extras of
monarch-jobs, imported on use, with the command that brings one when missing."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

from monarch.core import install_hint

EXTRAS: Final = {"monarch.telemetry": "telemetry", "monarch.admin": "admin"}
"""The optional wheel's module, and the monarch-jobs extra that installs it."""


def optional(module: str, needed_by: str) -> ModuleType:
    """Import ``module`` (a key of ``EXTRAS``); an ImportError naming the extra if absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module.startswith(exc.name):
            raise  # something the wheel itself needs is missing: its own error says what
        extra = EXTRAS[module]
        hint = install_hint("monarch-jobs", extra)
        raise ImportError(f"{needed_by} needs {module}: {hint}", name=module) from None
