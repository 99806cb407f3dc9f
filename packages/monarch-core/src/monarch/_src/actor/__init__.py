"""Upstream's ``monarch._src.actor``: ``bootstrap_main`` (the module procs run), ``mock`` and
``proc_mesh`` (the spawn callbacks)."""
