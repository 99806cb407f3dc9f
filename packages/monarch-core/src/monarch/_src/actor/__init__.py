"""Upstream's ``monarch._src.actor``: only ``bootstrap_main``, the module procs run."""
