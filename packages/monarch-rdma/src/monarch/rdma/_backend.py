"""Which backend this process uses: upstream's ``get_rdma_backend`` and its friends."""

from __future__ import annotations

import warnings

from monarch.core import current_config

from ._verbs import device_names


def is_ibverbs_available() -> bool:
    """Whether ibverbs RDMA hardware (or soft-RoCE) is available on this system."""
    return bool(device_names())


def is_rdma_available() -> bool:
    """Whether RDMA over ibverbs is available on this system.

    .. deprecated:: use :func:`is_ibverbs_available` or :func:`get_rdma_backend`.
    """
    warnings.warn(
        "is_rdma_available is deprecated because Monarch now supports multiple "
        "RDMA backends, making this function ambiguous. For now it indicates "
        "whether RDMA over ibverbs is available. Use is_ibverbs_available() or "
        "get_rdma_backend() instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()


def get_rdma_backend() -> str:
    """``"ibverbs"``, ``"tcp"`` (the fallback: shared memory within a host, TCP between
    hosts) or ``"none"`` (no verbs and ``rdma_allow_tcp_fallback=False``)."""
    config = current_config()
    if not config.rdma_disable_ibverbs and is_ibverbs_available():
        return "ibverbs"
    if config.rdma_allow_tcp_fallback:
        return "tcp"
    return "none"
