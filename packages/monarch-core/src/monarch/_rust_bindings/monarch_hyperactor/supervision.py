"""Upstream's home of ``SupervisionError`` and ``MeshFailure``: the classes of monarch.actor."""

from monarch.core._errors import MeshFailure, SupervisionError

__all__ = ["MeshFailure", "SupervisionError"]
