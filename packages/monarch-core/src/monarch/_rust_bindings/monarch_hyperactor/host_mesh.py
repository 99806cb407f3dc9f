"""Upstream's home of ``BootstrapCommand``."""

from monarch.core._mesh._launch import BootstrapCommand

__all__ = ["BootstrapCommand"]
