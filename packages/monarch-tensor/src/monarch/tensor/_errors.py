"""The one exception a tensor program sees for a failure on a worker."""

from __future__ import annotations


class RemoteException(Exception):
    """An operation failed on a worker (upstream's ``monarch.mesh_controller.RemoteException``).

    Raised where a value that depends on the failed operation is asked for (``fetch_shard``,
    ``inspect``), never at the call that recorded it: the controller does not wait for workers.
    """

    def __init__(self, op: str, rank: int, message: str, traceback: str = "") -> None:
        super().__init__(op, rank, message, traceback)
        self.op = op
        self.rank = rank
        self.message = message
        self.traceback = traceback

    def __str__(self) -> str:
        text = f"{self.op} failed on rank {self.rank}: {self.message}"
        return f"{text}\n{self.traceback}" if self.traceback else text
