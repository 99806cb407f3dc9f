"""Which backend this process uses: upstream's ``get_rdma_backend`` and its friends."""

from __future__ import annotations

import functools
import importlib
import warnings

from monarch.core import current_config

VERBS_PLANE = False
"""Whether the ibverbs data plane is built (not yet: a device is seen, the fallback runs)."""


@functools.cache
def _devices() -> tuple[str, ...]:
    """Names of the ibverbs devices pyverbs sees (none without pyverbs)."""
    try:
        device = importlib.import_module("pyverbs.device")
        return tuple(
            d.name.decode() if isinstance(d.name, bytes) else str(d.name)
            for d in device.get_device_list()
        )
    except Exception:  # noqa: BLE001 - no pyverbs, no libibverbs, no device: all "none"
        return ()


def is_ibverbs_available() -> bool:
    """Whether ibverbs RDMA hardware (or soft-RoCE) is available on this system."""
    return bool(_devices())


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
    if VERBS_PLANE and not config.rdma_disable_ibverbs and is_ibverbs_available():
        return "ibverbs"
    if config.rdma_allow_tcp_fallback:
        return "tcp"
    return "none"
