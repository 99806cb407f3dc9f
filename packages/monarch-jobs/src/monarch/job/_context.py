"""``monarch context create | use | rm | ls`` (upstream's): several saved jobs in one
folder, one of them active.

A context is a folder ``.monarch/<name>/``; its job is saved at ``.monarch/<name>/state.pkl``.
``.monarch/job_state.pkl``, where scripts' ``state()`` and the other subcommands look, is a
symbolic link to the active context's job; a plain saved job found there is first moved
into the context ``default``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

MONARCH_DIR = Path(".monarch")
LINK = MONARCH_DIR / "job_state.pkl"  # as _trait.DEFAULT_JOB_PATH, without importing it
STATE = "state.pkl"
DEFAULT = "default"


def register_context(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "context",
        help="manage job contexts (several saved jobs, one active)",
        description=f"Contexts: jobs saved side by side in {MONARCH_DIR}/<name>/; {LINK} "
        "points at the active one's.",
    )
    commands = parser.add_subparsers(title="CONTEXT COMMANDS", dest="context_cmd")
    for name, what in (
        ("create", "Create a new context"),
        ("use", f"Switch {LINK} to a context"),
        ("rm", "Remove a context (kills the job)"),
    ):
        sub = commands.add_parser(name, help=what)
        sub.add_argument("name", help="Context name")
    commands.add_parser("ls", help="List contexts")
    parser.set_defaults(func=_run, _context_parser=parser)


def context_dir(name: str) -> Path:
    if not name or name in (".", "..") or "/" in name or name == LINK.name:
        raise ValueError(f"a context name is one folder name, not {name!r}")
    return MONARCH_DIR / name


def current_context() -> str | None:
    """The active context: the folder ``job_state.pkl`` links into, if it is a link."""
    if not LINK.is_symlink():
        return None
    target = Path(os.readlink(LINK))
    return target.parts[0] if len(target.parts) == 2 and target.name == STATE else None


def _link_to(name: str) -> None:
    if LINK.is_symlink():
        LINK.unlink()
    LINK.symlink_to(Path(name) / STATE)  # relative: the folder can move


def _adopt_plain_job() -> None:
    """A job saved at ``job_state.pkl`` itself becomes the ``default`` context's."""
    if LINK.exists() and not LINK.is_symlink():
        context_dir(DEFAULT).mkdir(parents=True, exist_ok=True)
        LINK.rename(context_dir(DEFAULT) / STATE)
        _link_to(DEFAULT)


def create(name: str) -> None:
    context_dir(name).mkdir(parents=True, exist_ok=True)
    print(f"Created context '{name}'")


def use(name: str) -> None:
    folder = context_dir(name)
    _adopt_plain_job()
    folder.mkdir(parents=True, exist_ok=True)
    _link_to(name)
    print(f"Switched to context '{name}'")


def remove(name: str) -> None:
    folder = context_dir(name)
    saved = folder / STATE
    if saved.exists():
        from ._trait import job_load

        try:
            job_load(str(saved)).kill()
        except Exception as exc:  # noqa: BLE001 - the context goes anyway, as upstream's
            print(f"Could not kill the job of context '{name}': {exc}", file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    if current_context() == name:
        _link_to(DEFAULT)
    print(f"Removed context '{name}'")


def listing() -> None:
    names = (
        sorted(p.name for p in MONARCH_DIR.iterdir() if p.is_dir()) if MONARCH_DIR.is_dir() else []
    )
    if not names:
        print("No contexts.")
        return
    active = current_context()
    for name in names:
        print(f"{'* ' if name == active else '  '}{name}")


def _run(args: argparse.Namespace) -> int:
    command = args.context_cmd
    if command is None:
        args._context_parser.print_help()
        return 1
    try:
        if command == "ls":
            listing()
        else:
            {"create": create, "use": use, "rm": remove}[command](args.name)
    except (ValueError, OSError) as exc:
        print(f"monarch context: {exc}", file=sys.stderr)
        return 1
    return 0
