"""Upstream's ``monarch.tensor_engine``: empty in 0.7.0 (its RDMA moved to ``monarch.rdma``),
kept so that code importing it runs. The tensor engine itself is ``monarch.tensor``."""

__all__: list[str] = []
