"""The multi-rank debugger: ``breakpoint()`` in endpoints, ``monarch debug`` to attach.

``_hooks`` (what every process loads: the breakpoint hook, post-mortem, the lazy doors to
the rest), ``_pdb`` (pdb over a connection of its
own, imported at the first breakpoint), ``_sessions`` (the root's sessions, its ``debug``
service), ``_console`` (the terminal's commands), ``_commands`` (their parser),
``_controller`` (upstream's ``debug_controller()``).
"""

from ._hooks import breakpoint_hook, debug_controller, install_console, post_mortem

__all__ = [
    "breakpoint_hook",
    "debug_controller",
    "install_console",
    "post_mortem",
]
