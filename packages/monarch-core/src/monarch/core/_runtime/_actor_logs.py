"""``[actor=<name>]`` before Python log records emitted in an actor's code, as upstream's.

Upstream adds a filter to every handler (the root logger's, and each one added later), so
a record gets the prefix only when some handler writes it: with no handler configured
(Python's last resort writes it) it shows as it was logged. Ours does the same, once per
process, when its first actor starts; ``prefix_python_logs_with_actor`` turns it off.
"""

from __future__ import annotations

import logging

from monarch.core._config import current_config

from ._scope import current_context


class ActorFilter(logging.Filter):
    """Prefix a record with the actor whose code emitted it (once, whatever the number of
    handlers it passes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current_context.get()
        if context is None or getattr(record, "actor_prefix", None) is not None:
            return True
        if not current_config().prefix_python_logs_with_actor:
            return True
        prefix = f"[actor={context.actor_instance!r}] "
        record.actor_prefix = prefix
        if record.msg:  # empty ones are structured records (torch.compile's): left alone
            record.msg = f"{prefix}{record.msg}"
        return True


_filter = ActorFilter()
_installed = [False]


def install_actor_log_prefix() -> None:
    """Put the filter on the root logger's handlers and on every handler added later."""
    if _installed[0]:
        return
    _installed[0] = True
    for handler in logging.getLogger().handlers:
        handler.addFilter(_filter)
    add_handler = logging.Logger.addHandler

    def adding(self: logging.Logger, handler: logging.Handler) -> None:
        add_handler(self, handler)
        if _filter not in handler.filters:
            handler.addFilter(_filter)

    logging.Logger.addHandler = adding  # type: ignore[method-assign,assignment]
