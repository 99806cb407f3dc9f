"""Monarch's runtime internals: procs, hosts, routing, the ``monarch`` command. Not written yet."""

__all__: list[str] = []
