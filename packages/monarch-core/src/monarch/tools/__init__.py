"""Upstream's ``monarch.tools``: here only ``monarch.tools.config.Workspace``."""
