"""Upstream's home of ``Selection`` (also ``monarch.Selection``)."""

from monarch.core._layout._selection import Selection

__all__ = ["Selection"]
