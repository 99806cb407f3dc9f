"""Upstream's ``monarch.tools``: ``config`` (``Config``, ``Workspace``) and ``network``."""
