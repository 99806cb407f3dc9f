"""Upstream's ``Uid`` and ``ProcId`` (``monarch.actor.Uid``, ``monarch.actor.ProcId``).

A uid is either a *singleton* (a bare label, ``controller``) or an *instance*: a 64-bit value,
optionally labelled, written ``label<base58>`` with the base58 alphabet that starts ``1-9a-z``
(so 0 is ``<1>``). Instances compare by value alone, singletons by label, as upstream's do.
Labels are DNS-style: lowercase letter first, then ``[a-z0-9_-]``, ending in a letter or digit,
at most 63 characters. Parse errors are upstream's ``ValueError`` texts.
"""

from __future__ import annotations

import secrets
import string
from typing import Final, final

_ALPHABET: Final = "123456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
_DIGIT: Final = {c: i for i, c in enumerate(_ALPHABET)}
_U64_MAX: Final = (1 << 64) - 1
_LABEL_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
_MAX_LABEL: Final = 63
_SEPARATORS: Final = frozenset(string.punctuation) - {"-", "_"}
"""Characters that end a label token (upstream's lexer: ``<``, ``.``, ``@``, ``!``...)."""


def _label_problem(label: str) -> str | None:
    """Why ``label`` is not a valid uid label (upstream's words), or ``None``."""
    if not label:
        return "label must not be empty"
    if len(label) > _MAX_LABEL:
        return f"label exceeds {_MAX_LABEL} characters"
    if not ("a" <= label[0] <= "z"):
        return "label must start with a lowercase letter"
    if not ("a" <= label[-1] <= "z" or "0" <= label[-1] <= "9"):
        return "label must end with a lowercase letter or digit"
    for char in label:
        if char not in _LABEL_CHARS:
            return f"label contains invalid character {char!r}"
    return None


def _checked_label(label: str | None) -> str | None:
    if label is not None:
        if not isinstance(label, str):
            raise TypeError(f"argument 'label': {type(label).__name__!r} object is not str")
        problem = _label_problem(label)
        if problem:
            raise ValueError(f"invalid uid label: {problem}")
    return label


def _u64(value: int) -> int:
    if not isinstance(value, int):
        raise TypeError(f"argument 'value': {type(value).__name__!r} object is not an int")
    if value < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if value > _U64_MAX:
        raise OverflowError("int too big to convert")
    return value


def _base58(value: int) -> str:
    digits: list[str] = []
    while True:
        value, digit = divmod(value, len(_ALPHABET))
        digits.append(_ALPHABET[digit])
        if not value:
            return "".join(reversed(digits))


def _parse_uid(text: str) -> Uid:
    """``text`` as a uid; ``ValueError`` (without the caller's prefix) if it is not one."""
    if not isinstance(text, str):
        raise TypeError(f"argument 'uid': {type(text).__name__!r} object cannot be cast as 'str'")
    stop = next((i for i, char in enumerate(text) if char in _SEPARATORS), len(text))
    label, rest = text[:stop], text[stop:]
    if label:
        problem = _label_problem(label)
        if problem:
            raise ValueError(f"invalid uid syntax: invalid label: {problem}")
    if rest and rest[0] != "<":
        wanted = "end of input" if label else '"label" or "<"'
        raise ValueError(f'invalid uid syntax: expected {wanted}, found "{rest[0]}"')
    bracket, rest = rest[:1], rest[1:]
    if not bracket:
        if not label:
            raise ValueError('invalid uid syntax: expected "label" or "<", found end of input')
        return Uid._make(label, None)
    body, close, tail = rest.partition(">")
    if not close:
        raise ValueError('invalid uid syntax: expected ">", found end of input')
    if not body:
        raise ValueError('invalid uid syntax: expected uid text, found ">"')
    if tail:
        raise ValueError(f'invalid uid syntax: expected end of input, found "{tail[0]}"')
    value = 0
    for char in body:
        if char not in _DIGIT:
            raise ValueError(f"invalid uid syntax: invalid base58 uid: {body}")
        value = value * len(_ALPHABET) + _DIGIT[char]
    if value > _U64_MAX:
        raise ValueError(f"invalid uid syntax: invalid base58 uid: {body}")
    return Uid._make(label or None, value)


@final
class Uid:
    """A unique actor-system identifier: a singleton label, or a labelled 64-bit instance."""

    __slots__ = ("_label", "_value")

    _label: str | None
    _value: int | None

    def __init__(self) -> None:
        raise TypeError("cannot create 'Uid' instances: use Uid.instance() or Uid.from_string()")

    @classmethod
    def _make(cls, label: str | None, value: int | None) -> Uid:
        uid = object.__new__(cls)
        uid._label = label
        uid._value = value
        return uid

    @staticmethod
    def anonymous() -> Uid:
        """A fresh unlabelled instance uid."""
        return Uid._make(None, secrets.randbits(64))

    @staticmethod
    def instance(label: str | None = None) -> Uid:
        """A fresh instance uid with an optional display label."""
        return Uid._make(_checked_label(label), secrets.randbits(64))

    @staticmethod
    def instance_from_value(value: int, label: str | None = None) -> Uid:
        """The instance uid with this 64-bit value."""
        return Uid._make(_checked_label(label), _u64(value))

    @staticmethod
    def from_string(uid: str) -> Uid:
        """Parse a uid's canonical text (``label``, ``<base58>`` or ``label<base58>``)."""
        try:
            return _parse_uid(uid)
        except ValueError as error:
            raise ValueError(f"invalid uid: {error}") from None

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def is_instance(self) -> bool:
        return self._value is not None

    @property
    def is_singleton(self) -> bool:
        return self._value is None

    @property
    def instance_value(self) -> int | None:
        return self._value

    def __str__(self) -> str:
        if self._value is None:
            return self._label or ""
        return f"{self._label or ''}<{_base58(self._value)}>"

    def __repr__(self) -> str:
        return f"Uid({str(self)!r})"

    def _key(self) -> tuple[str, int | str | None]:
        return ("label", self._label) if self._value is None else ("value", self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Uid) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Uid.from_string, (str(self),))


@final
class ProcId:
    """The identity of a proc: a uid (``ProcId.from_string("worker<J>")``)."""

    __slots__ = ("_uid",)

    def __init__(self, uid: Uid) -> None:
        given: object = uid  # callers without type checking pass strings
        if not isinstance(given, Uid):
            kind = type(given).__name__
            raise TypeError(f"argument 'uid': {kind!r} object cannot be cast as 'Uid'")
        self._uid = given

    @staticmethod
    def from_string(proc_id: str) -> ProcId:
        """Parse a proc id's canonical text."""
        try:
            return ProcId(_parse_uid(proc_id))
        except ValueError as error:
            raise ValueError(f"invalid proc id: invalid proc id: {error}") from None

    @property
    def uid(self) -> Uid:
        return self._uid

    @property
    def label(self) -> str | None:
        return self._uid.label

    def __str__(self) -> str:
        return str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcId) and self._uid == other._uid

    def __hash__(self) -> int:
        return hash(("proc", self._uid))

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (ProcId.from_string, (str(self),))
