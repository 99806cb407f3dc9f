"""Upstream's ``monarch.tools.config.workspace`` (where its deprecation warnings point)."""

from monarch.core._mesh._workspace import Workspace

__all__ = ["Workspace"]
