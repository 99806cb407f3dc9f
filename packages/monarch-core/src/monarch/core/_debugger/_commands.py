"""The debugger console's commands, as upstream's ``monarch_dbg>`` prompt takes them.

``attach <actor> <rank>``, ``list``, ``cast <actor> ranks(...) <pdb command>``,
``continue``, ``quit``, ``help`` (and their one-letter forms). ``ranks(...)`` selects the
sessions of one actor mesh: one rank ``ranks(1)``, several ``ranks(1,4,6)``, a range
``ranks(start?:stop?:step?)``, or coordinates ``ranks(dim1=1:5:2,dim2=3,dim4=(3,6))``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

import msgspec

Ranks = int | list[int] | range | dict[str, int | list[int] | range]
"""Which ranks ``cast`` sends to."""


class Attach(msgspec.Struct, frozen=True):
    actor_name: str
    rank: int


class ListSessions(msgspec.Struct, frozen=True):
    """``list``"""


class Cast(msgspec.Struct, frozen=True):
    actor_name: str
    ranks: Ranks
    command: str


class Continue(msgspec.Struct, frozen=True):
    """``continue``"""


class Quit(msgspec.Struct, frozen=True):
    """``quit``"""


class Help(msgspec.Struct, frozen=True):
    """``help``"""


Command = Attach | ListSessions | Cast | Continue | Quit | Help

HELP = """monarch_dbg commands:
\tattach <actor_name> <rank> - attach to a debug session
\tlist - list all debug sessions
\tquit - exit the debugger, leaving all sessions in place
\tcast <actor_name> ranks(...) <command> - send a command to a set of ranks on the specified \
actor mesh.
\t\tThe value inside ranks(...) can be a single rank (ranks(1)),
\t\ta list of ranks (ranks(1,4,6)), a range of ranks (ranks(start?:stop?:step?)),
\t\tor a dict of dimensions (ranks(dim1=1:5:2,dim2=3, dim4=(3,6))).
\tcontinue - clear all breakpoints and tell all ranks to continue
\thelp - print this help message
"""

_NAME = r"[-_a-zA-Z0-9]+"
_ATTACH = re.compile(rf"(?:a|attach)\s+({_NAME})\s+(\d+)")
_CAST = re.compile(rf"cast\s+({_NAME})\s*ranks\(([^)]*(?:\([^)]*\)[^)]*)*)\)\s*(\w.*)")
_WORDS: Mapping[str, Command] = {
    "l": ListSessions(),
    "list": ListSessions(),
    "c": Continue(),
    "continue": Continue(),
    "q": Quit(),
    "quit": Quit(),
    "h": Help(),
    "help": Help(),
}


def parse(line: str) -> Command:
    """The command ``line`` says; ValueError says what is wrong with it."""
    text = line.strip()
    if text in _WORDS:
        return _WORDS[text]
    if (attach := _ATTACH.fullmatch(text)) is not None:
        return Attach(attach[1], int(attach[2]))
    if (cast := _CAST.fullmatch(text)) is not None:
        return Cast(cast[1], parse_ranks(cast[2]), cast[3])
    raise ValueError(f"unknown command {text!r} (enter 'help' for the commands)")


def parse_ranks(text: str) -> Ranks:
    """What is inside ``ranks(...)``."""
    text = text.replace(" ", "")
    if not text:
        raise ValueError("ranks() names no rank")
    if "=" in text:
        found = re.findall(r"([A-Za-z_]\w*)=(\([^)]*\)|[^,]+)", text)
        if ",".join(f"{name}={value}" for name, value in found) != text:
            raise ValueError(f"bad ranks({text})")
        return {name: _dim_value(value) for name, value in found}
    if ":" in text:
        return _range(text)
    if "," in text:
        return _ints(text)
    return _int(text)


def _dim_value(value: str) -> int | list[int] | range:
    if value.startswith("("):
        return _ints(value[1:-1])
    if ":" in value:
        return _range(value)
    return _int(value)


def _int(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a rank")
    return int(text)


def _ints(text: str) -> list[int]:
    return [_int(part) for part in text.split(",")]


def _range(text: str) -> range:
    parts = text.split(":")
    if len(parts) > 3:
        raise ValueError(f"bad range {text!r}")
    start = _int(parts[0]) if parts[0] else 0
    stop = _int(parts[1]) if parts[1] else sys.maxsize
    step = _int(parts[2]) if len(parts) == 3 and parts[2] else 1
    if step == 0:
        raise ValueError(f"bad range {text!r}: step 0")
    return range(start, stop, step)


def selects(ranks: Ranks | None, rank: int, coords: Mapping[str, int]) -> bool:
    """Whether a session at ``rank`` (``coords`` in its mesh) is among ``ranks``."""
    if ranks is None:
        return True
    if isinstance(ranks, int):
        return rank == ranks
    if isinstance(ranks, (list, range)):
        return rank in ranks
    for dim, wanted in ranks.items():
        if dim not in coords:
            return False
        value = coords[dim]
        if value != wanted if isinstance(wanted, int) else value not in wanted:
            return False
    return True
