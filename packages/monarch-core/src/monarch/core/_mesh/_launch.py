"""How procs are started: upstream's ``BootstrapCommand`` and ``default_bootstrap_cmd``.

A host agent starts each proc with a command; ``spawn_procs(bootstrap_command=...)`` lets
the user choose it (another program or Python, arguments, environment), uniformly or per
proc. What travels to the agent is a ``Launch`` (``_messages``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Final

from monarch.core._runtime._messages import Launch

BOOTSTRAP_MAIN: Final = "monarch._src.actor.bootstrap_main"
"""The module a proc runs (``python -m``), as upstream names it (``monarch._src``)."""


class BootstrapCommand:
    """The command a host agent runs to start a proc.

    ``env`` is set over the agent's environment (a ``None`` value removes a variable), or
    over an empty one when ``inherit_env`` is false; Monarch's own variables are always set.
    """

    def __init__(
        self,
        program: str,
        arg0: str | None,
        args: list[str],
        env: Mapping[str, str | None],
        inherit_env: bool = True,
    ) -> None:
        self.program = program
        self.arg0 = arg0
        self.args = list(args)
        self._env = dict(env)
        self.inherit_env = inherit_env

    @property
    def env(self) -> dict[str, str | None]:
        return dict(self._env)

    @env.setter
    def env(self, env: Mapping[str, str | None]) -> None:
        self._env = dict(env)

    def with_env(self, env: Mapping[str, str | None]) -> BootstrapCommand:
        """A copy with ``env`` merged over its environment (``None`` removes a variable)."""
        return BootstrapCommand(
            self.program, self.arg0, self.args, {**self._env, **env}, self.inherit_env
        )

    def launch(self, bind: Mapping[str, str] | None = None) -> Launch:
        """What the host agent is told (``bind``: the proc's ``proc_bind`` entry)."""
        return Launch(
            self.program,
            self.arg0,
            tuple(self.args),
            dict(self._env),
            self.inherit_env,
            dict(bind or {}),
        )

    def __repr__(self) -> str:
        # Upstream's (a Rust Debug rendering): args as JSON strings, env values as Options.
        import json  # here only: not imported by every process

        args = "[" + ", ".join(json.dumps(arg) for arg in self.args) + "]"
        env = ", ".join(
            f"{json.dumps(k)}: {'None' if v is None else f'Some({json.dumps(v)})'}"
            for k, v in self._env.items()
        )
        arg0 = f", arg0={self.arg0!r}" if self.arg0 is not None else ""
        return (
            f"BootstrapCommand(program={self.program!r}{arg0}, args={args}, env={{{env}}}, "
            f"inherit_env={self.inherit_env})"
        )


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command procs are started with by default: this Python, ``-m`` the proc module.

    Procs inherit the environment of the host agent that starts them; customize with
    ``with_env()`` (a ``None`` value removes a variable), or set ``inherit_env = False``.
    """
    return BootstrapCommand(sys.executable, None, ["-m", BOOTSTRAP_MAIN], {})
