"""``Selection``: upstream's selection expressions over a mesh's dimensions (``monarch.Selection``).

Upstream exposes the type to build and show expressions (``Selection.all()``, ``.any()``,
``.from_string("(*, 0:4, ?)")``); no public API takes one (``send`` takes ``"all"`` or
``"choose"``), so what matters to user code is which strings parse, what they parse to (their
``repr``, in upstream's notation) and the errors of those that do not.

The grammar, whitespace ignored, loosest first: ``a | b`` (union) < ``a & b`` (intersection) <
``a, b`` (``a`` on the first dimension, ``b`` on the rest) < an atom: ``*`` (every index),
``?`` (any one), ``i``, ``start:end:step`` (each part optional, ``:`` alone meaning all), or a
parenthesised expression, whose innermost selections take what follows its comma.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NoReturn, final

__all__ = ["Selection"]

_U64_MAX: Final = 2**64 - 1
_WHITESPACE: Final = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""What upstream strips before parsing (Rust's ``char::is_whitespace``)."""


# -- the expression tree (upstream's variants; each repr is upstream's) ------------------------


class _Node:
    __slots__ = ()

    def then(self, rest: _Node) -> _Node:
        """This selection with ``rest`` selecting the dimensions after the ones it covers."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _True(_Node):
    def then(self, rest: _Node) -> _Node:
        return rest

    def __repr__(self) -> str:
        return "True"


@dataclass(frozen=True, slots=True)
class _Dim(_Node):
    kind: str  # "All" or "Any"
    inner: _Node

    def then(self, rest: _Node) -> _Node:
        return _Dim(self.kind, self.inner.then(rest))

    def __repr__(self) -> str:
        return f"{self.kind}({self.inner!r})"


@dataclass(frozen=True, slots=True)
class _Range(_Node):
    start: int
    end: int | None
    step: int
    inner: _Node

    def then(self, rest: _Node) -> _Node:
        return _Range(self.start, self.end, self.step, self.inner.then(rest))

    def __repr__(self) -> str:
        end = "None" if self.end is None else f"Some({self.end})"
        return f"Range(Range({self.start}, {end}, {self.step}), {self.inner!r})"


@dataclass(frozen=True, slots=True)
class _Combine(_Node):
    kind: str  # "Union" or "Intersection"
    left: _Node
    right: _Node

    def then(self, rest: _Node) -> _Node:
        return _Combine(self.kind, self.left.then(rest), self.right.then(rest))

    def __repr__(self) -> str:
        return f"{self.kind}({self.left!r}, {self.right!r})"


_TRUE: Final = _True()


# -- the parser: recursive descent, every optional part backtracking ------------------------


class _NoMatch(Exception):
    """The expression cannot start here."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self, char: str) -> bool:
        return self.text.startswith(char, self.pos)

    def expr(self) -> _Node:
        node = self.intersection()
        while self.peek("|"):
            saved = self.pos
            self.pos += 1
            try:
                node = _Combine("Union", node, self.intersection())
            except _NoMatch:
                self.pos = saved
                break
        return node

    def intersection(self) -> _Node:
        node = self.dimension()
        while self.peek("&"):
            saved = self.pos
            self.pos += 1
            try:
                node = _Combine("Intersection", node, self.dimension())
            except _NoMatch:
                self.pos = saved
                break
        return node

    def dimension(self) -> _Node:
        node = self.atom()
        if self.peek(","):
            saved = self.pos
            self.pos += 1
            try:
                return node.then(self.dimension())
            except _NoMatch:
                self.pos = saved
        return node

    def atom(self) -> _Node:
        if self.peek("("):
            saved = self.pos
            self.pos += 1
            try:
                node = self.expr()
            except _NoMatch:
                self.pos = saved
                raise
            if not self.peek(")"):
                self.pos = saved
                raise _NoMatch
            self.pos += 1
            return node
        for char, kind in (("*", "All"), ("?", "Any")):
            if self.peek(char):
                self.pos += 1
                return _Dim(kind, _TRUE)
        return self.range()

    def number(self) -> int | None:
        """A u64 here (consumed), or None (nothing consumed)."""
        end = self.pos
        while end < len(self.text) and self.text[end] in "0123456789":
            end += 1
        if end == self.pos or int(self.text[self.pos : end]) > _U64_MAX:
            return None
        value = int(self.text[self.pos : end])
        self.pos = end
        return value

    def range(self) -> _Node:
        start = self.number()
        if not self.peek(":"):
            if start is None:
                raise _NoMatch
            return _Range(start, (start + 1) & _U64_MAX, 1, _TRUE)  # u64 wraps
        self.pos += 1
        end = self.number()
        step = 1
        if self.peek(":"):
            saved = self.pos
            self.pos += 1
            given = self.number()
            if given is None:
                self.pos = saved
            else:
                step = given
        return _Range(start or 0, end, step, _TRUE)


def _debug_str(text: str) -> str:
    """``text`` quoted as Rust's ``{:?}`` shows a str."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\0":
            out.append("\\0")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(f"\\u{{{ord(char):x}}}")
    return '"' + "".join(out) + '"'


def _parse(text: str) -> _Node:
    stripped = "".join(char for char in text if char not in _WHITESPACE)
    parser = _Parser(stripped)
    try:
        node = parser.expr()
    except _NoMatch:
        _refuse(stripped, stripped, "Tag")
    if parser.pos != len(stripped):
        _refuse(stripped[parser.pos :], stripped, "Eof")
    return node


def _refuse(rest: str, whole: str, code: str) -> NoReturn:
    raise ValueError(
        f"parse error: Failed to parse selection: Error(Error {{ input: {_debug_str(rest)}, "
        f"code: {code} }}) (input: {_debug_str(whole)})"
    )


@final
class Selection:
    """A selection expression (``Selection.all()``, ``.any()``, ``.from_string(text)``).

    Made only by those class methods, as upstream's; neither picklable nor compared by value
    (upstream's are not).
    """

    __slots__ = ("_node",)

    _node: _Node

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(f"cannot create '{__name__}.Selection' instances")

    @classmethod
    def _of(cls, node: _Node) -> Selection:
        selection = object.__new__(cls)
        selection._node = node
        return selection

    @classmethod
    def from_string(cls, s: str) -> Selection:
        """Parse a selection expression (``"(*, 0:4, ?)"``, ``"0 & (1 | 2)"``); ValueError if
        it is not one."""
        given: object = s  # any object may come; only a str is taken
        if not isinstance(given, str):
            kind = type(given).__name__
            raise TypeError(f"argument 'input': '{kind}' object cannot be cast as 'str'")
        return cls._of(_parse(s))

    @classmethod
    def all(cls) -> Selection:
        """Every member (``*`` on each dimension)."""
        return cls._of(_Dim("All", _TRUE))

    @classmethod
    def any(cls) -> Selection:
        """One member chosen at random (``?`` on each dimension)."""
        return cls._of(_Dim("Any", _TRUE))

    def __reduce__(self) -> NoReturn:
        raise TypeError(f"cannot pickle '{__name__}.Selection' object")

    def __repr__(self) -> str:
        return repr(self._node)
