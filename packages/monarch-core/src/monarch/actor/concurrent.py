"""Upstream's ``monarch.actor.concurrent``: where ``concurrent_endpoint`` is also importable from."""

from monarch.core._endpoint import concurrent_endpoint

__all__ = ["concurrent_endpoint"]
