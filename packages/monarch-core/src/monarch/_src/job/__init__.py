"""Upstream's ``monarch._src.job``: ``kubernetes`` (the pod bootstrap its examples build on)."""
