"""``monarch.builtins``: remote functions every program may want (upstream's), run on every
proc of the active mesh in order with the tensor ops: ``log_remote`` and
``set_logging_level_remote`` here, the random number helpers in ``monarch.builtins.random``."""

from .log import log_remote, set_logging_level_remote

__all__ = ["log_remote", "set_logging_level_remote"]
