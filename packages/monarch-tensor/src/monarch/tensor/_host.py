"""This process's host as the procs of other machines reach it."""

from __future__ import annotations

from monarch.core import WILDCARD_HOSTS, current_runtime, ip_host


def reachable_host() -> str:
    """The host of this process's network address, else loopback: where a store it
    serves, or a gloo device it opens, is reached by its peers."""
    host = ip_host(current_runtime().address)
    return host if host and host not in WILDCARD_HOSTS else "127.0.0.1"
