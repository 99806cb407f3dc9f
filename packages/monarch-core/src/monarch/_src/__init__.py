"""Upstream's private package, for the few names user code reaches into (``monarch._src``)."""
