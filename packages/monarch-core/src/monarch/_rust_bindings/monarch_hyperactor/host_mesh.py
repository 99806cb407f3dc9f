"""Upstream's home of ``BootstrapCommand``."""

from monarch.core._launch import BootstrapCommand

__all__ = ["BootstrapCommand"]
