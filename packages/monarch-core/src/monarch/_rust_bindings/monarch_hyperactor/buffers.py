"""Upstream's home of ``Buffer`` and ``FrozenBuffer`` (the zero-copy write buffer)."""

from monarch.core._payload._buffers import Buffer, FrozenBuffer

__all__ = ["Buffer", "FrozenBuffer"]
