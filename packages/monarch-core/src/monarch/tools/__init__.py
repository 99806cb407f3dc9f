"""Upstream's ``monarch.tools``: ``config`` (``Workspace``, ``Config``, ``NOT_SET``) and ``network``."""
