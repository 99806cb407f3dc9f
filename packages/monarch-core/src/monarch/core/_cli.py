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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
