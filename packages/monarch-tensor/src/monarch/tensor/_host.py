"""This process's host as the procs of other machines reach it."""

from __future__ import annotations

from monarch.core import current_runtime


def reachable_host() -> str:
    """The host of this process's network address (tcp, tls, ibverbs), else loopback: where a store
    it serves, or a gloo device it opens, is reached by its peers."""
    address = current_runtime().address
    if address.startswith(("tcp://", "tls://", "ibverbs://")):  # ibverbs: TCP underneath
        host = address.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
        if host not in ("", "0.0.0.0", "::"):
            return host
    return "127.0.0.1"
