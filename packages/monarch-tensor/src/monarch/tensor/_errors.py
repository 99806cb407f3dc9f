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


class Poison:
    """What a worker holds at a failed id: the exception its fetch raises."""

    __slots__ = ("error",)

    def __init__(self, error: RemoteException) -> None:
        self.error = error


class Failed(Exception):
    """An input of a command is poisoned: its outputs get the same poison."""

    def __init__(self, poison: Poison) -> None:
        self.poison = poison


class CommandError(TypeError):
    """A worker received something that is not a batch of engine commands (a controller of
    another version, or a message built by hand)."""
