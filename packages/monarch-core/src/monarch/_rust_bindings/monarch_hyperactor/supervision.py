"""Upstream's home of ``SupervisionError`` and ``MeshFailure``: the classes of monarch.actor."""

from monarch.core._actor import SupervisionError
from monarch.core._supervision import MeshFailure

__all__ = ["MeshFailure", "SupervisionError"]
