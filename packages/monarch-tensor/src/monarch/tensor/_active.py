"""Which mesh torch operations go to: a stack of clients, None for "no mesh"."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ._client import MeshClient


class _Stack(threading.local):
    def __init__(self) -> None:
        self.clients: list[MeshClient | None] = []


_stack = _Stack()


def current_client() -> MeshClient | None:
    """The innermost active mesh's client (None outside ``activate()`` or in ``no_mesh``)."""
    clients = _stack.clients
    return clients[-1] if clients else None


@contextmanager
def pushed(client: MeshClient | None) -> Iterator[None]:
    _stack.clients.append(client)
    try:
        yield
    finally:
        _stack.clients.pop()
