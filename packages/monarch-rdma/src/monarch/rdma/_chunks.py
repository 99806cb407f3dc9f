"""How a transfer is cut into chunks and spread over streams (the TCP plane).

One stream between two processes moves about a core's worth of copying; several side by
side use more cores on both ends, and a chunk taken by whichever stream is free first
lets a slow stream take fewer. Chunks are at most ``rdma_max_chunk_size_mb`` and, when
there are enough bytes, at least ``rdma_min_stripe_size_kb``, as upstream's knobs say.
"""

from __future__ import annotations

MIB = 1024 * 1024
KIB = 1024


def plan(size: int, streams: int, max_chunk: int, min_stripe: int) -> list[tuple[int, int]]:
    """(offset, length) chunks that cover ``[0, size)`` in order, with no gap or overlap:
    enough of them to give each of ``streams`` one when ``size`` allows chunks of at least
    ``min_stripe``, none larger than ``max_chunk``."""
    if size <= 0:
        return []
    streams = max(1, streams)
    max_chunk = max(1, max_chunk)
    min_stripe = max(1, min(min_stripe, max_chunk))
    per_stream = -(-size // streams)
    chunk = min(max_chunk, max(min_stripe, per_stream))
    return [(start, min(chunk, size - start)) for start in range(0, size, chunk)]
