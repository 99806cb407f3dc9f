"""Upstream's ``monarch.tools.config``: the ``Workspace`` that ``sync_workspace`` takes."""

from monarch.core._workspace import Workspace

__all__ = ["Workspace"]
