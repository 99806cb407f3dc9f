"""What code is running here: the actor it belongs to, and the message it handles.

The actor runner (``_runner``) sets both around an actor's code: context variables, so
each sync actor's thread and each async actor's task sees its own. The floors between
read them without knowing the runner: a mesh spawned by an actor's code is owned by that
actor (``current_owner``), a value sent to a port carries the rank of the message being
handled (``current_context``). ``_context`` builds the user's ``context()`` on them.
"""

from __future__ import annotations

import contextvars
from typing import Any, Protocol

from monarch.core._errors import MeshFailure


class Owner(Protocol):
    """An actor, as the owner of the meshes its code spawns (see ``_supervision``)."""

    owned: list[Any]
    """Meshes it spawned: stopped before it, and dying with it."""

    actor_name: str
    """Its name in supervision texts, ``<root>.<module.Class mesh{coords}>`` (``_reports``)."""

    def supervise(self, failure: MeshFailure) -> None:
        """A mesh it owns failed: ``__supervise__`` runs between its messages."""


current_owner: contextvars.ContextVar[Owner | None] = contextvars.ContextVar(
    "monarch_actor_host", default=None
)
"""The actor whose code is running: the owner of any mesh that code spawns (``None``: the
process itself, the root client's)."""

current_context: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "monarch_context", default=None
)
"""The ``_context.Context`` of the message being handled (``None`` outside actors)."""


def message_rank() -> int:
    """The rank of the message being handled within the mesh slice it was sent to (0
    outside actors)."""
    context = current_context.get()
    return context.message_rank.rank if context is not None else 0
