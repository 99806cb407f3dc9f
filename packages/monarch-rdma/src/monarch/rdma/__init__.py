"""RDMA buffers: ``RDMABuffer``, ``RDMAAction``, ``get_rdma_backend`` (upstream's ``monarch.rdma``).

Not written yet.
"""

__all__: list[str] = []
