"""Upstream's ``monarch.actor.concurrent``, a second home of ``concurrent_endpoint``."""

from monarch.core._mesh._endpoint import concurrent_endpoint

__all__ = ["concurrent_endpoint"]
