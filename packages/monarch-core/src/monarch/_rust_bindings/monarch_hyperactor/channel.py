"""Upstream's home of ``ChannelTransport`` and ``BindSpec`` (the ``default_transport`` value)."""

from monarch.core._attach import ChannelTransport
from monarch.core._config import BindSpec

__all__ = ["BindSpec", "ChannelTransport"]
