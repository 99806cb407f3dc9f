"""Upstream's ``monarch.fetch`` (``from monarch.fetch import fetch_shard``, as its docs and
examples write it): the tensor engine's fetches, by that module path."""

from monarch.tensor import fetch_shard, inspect, show

__all__ = ["fetch_shard", "inspect", "show"]
