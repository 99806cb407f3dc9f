"""Distributed tensors: ``Tensor``, ``remote``, ``fetch_shard``, ``reduce``, ``Stream``, ...

Provides upstream's top-level tensor names (``monarch.Tensor`` and friends resolve here).
Not written yet.
"""

__all__: list[str] = []
