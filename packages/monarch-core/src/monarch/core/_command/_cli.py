"""The ``monarch`` command.

Subcommands other than the built-in ``version`` come from the ``monarch.commands`` entry-point
group: each entry point names a ``register(subparsers)`` callable that adds one subparser and sets
its ``func`` default to a handler ``func(args) -> int | None``. Keep ``register`` cheap (argparse
only) and import heavy modules inside the handler: every invocation loads every plug-in.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

from monarch._wheels import COMMANDS, install_hint, upstream_installed
from monarch.transport import plugin_group

COMMANDS_GROUP = "monarch.commands"


class _EntryPoint(Protocol):
    name: str

    def load(self) -> Callable[..., object]: ...


def _installed_version() -> str:
    try:
        return version("monarch-core")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


def _version(args: argparse.Namespace) -> int:
    print(f"monarch {_installed_version()}")
    upstream = upstream_installed()
    if upstream is not None:
        print(f"monarch: warning: {upstream}", file=sys.stderr)
        return 1
    return 0


def _plugins() -> Iterable[_EntryPoint]:
    return plugin_group(COMMANDS_GROUP).entries().values()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="monarch", description="Monarch: single-controller distributed programming."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    subparsers.add_parser("version", help="print the installed version").set_defaults(func=_version)
    for ep in sorted(_plugins(), key=lambda ep: ep.name):
        try:
            ep.load()(subparsers)
        except Exception as e:  # noqa: BLE001  # a broken plug-in must not break the command
            print(f"monarch: skipping subcommand plug-in {ep.name!r}: {e!r}", file=sys.stderr)
    return parser


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    """The subcommands ``parser`` has (the plug-ins that loaded)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    wheel = COMMANDS.get(argv[0]) if argv else None
    if wheel is not None and argv[0] not in _commands(parser):
        print(
            f"monarch: '{argv[0]}' is a command of the {wheel} wheel, which is not installed "
            f"here: {install_hint(wheel)}",
            file=sys.stderr,
        )
        return 2
    args = parser.parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
