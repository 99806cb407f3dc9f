"""Upstream's home of ``ChannelTransport`` and ``BindSpec`` (the ``default_transport`` value)."""

from monarch.core._config import BindSpec
from monarch.core._host._attach import ChannelTransport

__all__ = ["BindSpec", "ChannelTransport"]
