"""Upstream's ``monarch._src.actor``: ``bootstrap_main`` (the module procs run) and ``mock``."""
