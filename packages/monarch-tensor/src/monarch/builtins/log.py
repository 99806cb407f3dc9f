"""Logging on the workers, through the ``monarch.builtins.log`` logger of each proc."""

from __future__ import annotations

import logging

from monarch.tensor import remote

logger = logging.getLogger(__name__)


def _log(*args: object, level: int = logging.WARNING, **kwargs: object) -> None:
    logger.log(level, *args, **kwargs)  # type: ignore[arg-type]


def _set_level(level: int) -> None:
    logger.setLevel(level)


log_remote = remote(_log, propagate="inspect")
"""``log_remote(msg, *args, level=logging.WARNING)``: log on every proc."""

set_logging_level_remote = remote(_set_level, propagate="inspect")
"""``set_logging_level_remote(level)``: the level of the workers' logger."""
