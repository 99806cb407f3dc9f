"""Durations in humantime syntax (``"1h 30m"``, ``"500ms"``), as upstream writes them, and sizes.

Durations are counted in integer nanoseconds through ``Fraction``, never floats, so ``"0.1s"`` is
exactly 100 ms and text -> nanoseconds -> text round-trips exactly. Every error is a ValueError.
"""

from __future__ import annotations

import datetime
import math
import numbers
import re
from fractions import Fraction
from typing import Final

NS: Final = 1_000_000_000
"""Nanoseconds in a second."""

_YEAR_S: Final = 31_557_600  # 365.25 days, as humantime counts them
_MONTH_S: Final = 2_630_016  # 30.44 days, as humantime counts them

_UNIT_NS: Final[dict[str, int]] = {
    **dict.fromkeys(("ns", "nsec", "nanos"), 1),
    **dict.fromkeys(("us", "usec", "µs", "μs", "micros"), 1_000),
    **dict.fromkeys(("ms", "msec", "millis"), 1_000_000),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), NS),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60 * NS),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600 * NS),
    **dict.fromkeys(("d", "day", "days"), 86_400 * NS),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86_400 * NS),
    **dict.fromkeys(("M", "month", "months"), _MONTH_S * NS),
    **dict.fromkeys(("y", "year", "years"), _YEAR_S * NS),
}
_NUMBER: Final = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_NUMBER_RE: Final = re.compile(rf"\s*({_NUMBER})\s*")
_TERM_RE: Final = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Zµμ]+)")


def _unit_ns(unit: str) -> int:
    ns = _UNIT_NS.get(unit)
    if ns is None and len(unit) > 1:  # "M" (month) vs "m" (minute) is the only case that matters
        ns = _UNIT_NS.get(unit.lower())
    if ns is None:
        raise ValueError(f"unknown time unit {unit!r}")
    return ns


def parse_duration_ns(text: str) -> int:
    """Parse humantime (``"1h 30m"``, ``"500ms"``) or a plain number of seconds to nanoseconds."""
    plain = _PLAIN_NUMBER_RE.fullmatch(text)
    if plain is not None:
        return round(Fraction(plain.group(1)) * NS)
    total = Fraction(0)
    pos, end = 0, len(text.rstrip())
    if end == 0:
        raise ValueError("empty duration")
    while pos < end:
        term = _TERM_RE.match(text, pos)
        if term is None:
            raise ValueError(f"invalid duration {text!r} (expected e.g. '30s', '500ms', '1h 30m')")
        total += Fraction(term.group(1)) * _unit_ns(term.group(2))
        pos = term.end()
    return round(total)


# -- upstream's parser (Rust humantime), for ``configure``: its syntax and its words ----------

# Each unit: (nanoseconds per unit, whether a fraction of it must come to whole seconds).
_HUMANTIME_UNITS: Final[dict[str, tuple[int, bool]]] = {
    **dict.fromkeys(("nanos", "nsec", "ns"), (1, False)),
    **dict.fromkeys(("usec", "us", "µs"), (1_000, False)),
    **dict.fromkeys(("millis", "msec", "ms"), (1_000_000, False)),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), (NS, False)),
    **dict.fromkeys(("minutes", "minute", "min", "mins", "m"), (60 * NS, False)),
    **dict.fromkeys(("hours", "hour", "hr", "hrs", "h"), (3_600 * NS, True)),
    **dict.fromkeys(("days", "day", "d"), (86_400 * NS, True)),
    **dict.fromkeys(("weeks", "week", "wk", "wks", "w"), (7 * 86_400 * NS, True)),
    **dict.fromkeys(("months", "month", "M"), (_MONTH_S * NS, True)),
    **dict.fromkeys(("years", "year", "yr", "yrs", "y"), (_YEAR_S * NS, True)),
}
_U64_MAX: Final = 2**64 - 1
_DIGITS: Final = "0123456789"
_UNIT_LETTERS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZµ")
_RUST_WHITESPACE: Final = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_TOO_LARGE: Final = (
    "number is too large or cannot be represented without a lack of precision "
    "(values below 1ns are not supported)"
)


def _u64(value: int) -> int:
    """``value``, which upstream computes in a u64: too large is its one overflow error."""
    if value > _U64_MAX:
        raise ValueError(_TOO_LARGE)
    return value


class _Humantime:
    """One parse of upstream's duration syntax: terms of a number (``5``, ``1.5``; whitespace
    inside is skipped) and a unit, whitespace between terms optional. Positions are indexes
    into the text; errors give byte offsets, as upstream's do."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.seconds = 0
        self.nanos = 0

    def offset(self, index: int) -> int:
        return len(self.text[:index].encode())

    def next_char(self) -> str | None:
        if self.pos >= len(self.text):
            return None
        self.pos += 1
        return self.text[self.pos - 1]

    def first_digit(self) -> int | None:
        start = self.pos
        while (char := self.next_char()) is not None:
            if char in _DIGITS:
                return int(char)
            if char not in _RUST_WHITESPACE:
                raise ValueError(f"expected number at {self.offset(start)}")
        return None

    def parse(self) -> int:
        if self.text == "0":
            return 0
        number = self.first_digit()
        if number is None:
            raise ValueError("value was empty")
        while True:
            number, fraction, unit_start = self.number(number)
            following, unit_end = self.unit()
            self.add(number, fraction, self.text[unit_start:unit_end])
            if following is None:
                following = self.first_digit()
                if following is None:
                    return self.seconds * NS + self.nanos
            number = following

    def number(self, number: int) -> tuple[int, tuple[int, int] | None, int]:
        """The rest of a number, its fraction (numerator, denominator) and where its unit
        starts (having read the unit's first letter), or the end of the text."""
        at = self.pos
        while (char := self.next_char()) is not None:
            if char in _DIGITS:
                number = _u64(number * 10 + int(char))
            elif char in _UNIT_LETTERS:
                return number, None, at
            elif char == ".":
                fraction, at = self.fraction(at)
                return number, fraction, at
            elif char not in _RUST_WHITESPACE:
                raise ValueError(f"invalid character at {self.offset(at)}")
            at = self.pos
        return number, None, at

    def fraction(self, at: int) -> tuple[tuple[int, int], int]:
        """The digits after a ``.``: (numerator, denominator), where the unit starts."""
        numerator, denominator = 0, 1
        while (char := self.next_char()) is not None:
            if char in _DIGITS:
                numerator = _u64(numerator * 10 + int(char))
                denominator = _u64(denominator * 10)
            elif char in _UNIT_LETTERS:
                break
            elif char not in _RUST_WHITESPACE:
                raise ValueError(f"invalid character at {self.offset(at)}")
            at = self.pos
        if denominator == 1:  # no digit after the point
            raise ValueError(f"invalid character at {self.offset(at)}")
        return (numerator, denominator), at

    def unit(self) -> tuple[int | None, int]:
        """Read the rest of a unit: the next number's first digit when one follows at once,
        and where the unit ends."""
        at = self.pos
        while (char := self.next_char()) is not None:
            if char in _DIGITS:
                return int(char), at
            if char in _RUST_WHITESPACE:
                break
            if char not in _UNIT_LETTERS:
                raise ValueError(f"invalid character at {self.offset(at)}")
            at = self.pos
        return None, at

    def add(self, number: int, fraction: tuple[int, int] | None, unit: str) -> None:
        known = _HUMANTIME_UNITS.get(unit)
        if known is None:
            if not unit:
                raise ValueError(f"time unit needed, for example {number}sec or {number}ms")
            raise ValueError(
                f'unknown time unit "{unit}", supported units: ns, us/µs, ms, sec, min, hours, '
                "days, weeks, months, years (and few variations)"
            )
        per, whole_seconds = known
        self.add_ns(_u64(number * per) if per < NS else _u64(number * (per // NS)) * NS)
        if fraction is None:
            return
        numerator, denominator = fraction
        if per == 1:  # a fraction of a nanosecond
            raise ValueError(_TOO_LARGE)
        scale = per // NS if whole_seconds else per
        part, rest = divmod(_u64(numerator * scale), denominator)
        if rest:
            raise ValueError(_TOO_LARGE)
        self.add_ns(part * NS if whole_seconds else part)

    def add_ns(self, ns: int) -> None:
        seconds, nanos = divmod(self.nanos + ns, NS)
        self.seconds = _u64(self.seconds + seconds)
        self.nanos = nanos


def parse_humantime_ns(text: str) -> int:
    """Nanoseconds in ``text`` as upstream's ``configure`` reads durations (Rust humantime:
    ``"1h 30m"``, ``"1.5s"``, ``"0"``; no plain numbers, no signs); ValueError in its words."""
    return _Humantime(text).parse()


def format_duration_ns(ns: int) -> str:
    """Format nanoseconds the way humantime does, largest unit first (``300s`` -> ``"5m"``)."""
    if ns == 0:
        return "0s"
    secs, nanos = divmod(ns, NS)
    years, rem = divmod(secs, _YEAR_S)
    months, rem = divmod(rem, _MONTH_S)
    days, rem = divmod(rem, 86_400)
    hours, rem = divmod(rem, 3_600)
    minutes, seconds = divmod(rem, 60)
    millis, rem = divmod(nanos, 1_000_000)
    micros, nanos = divmod(rem, 1_000)
    parts: list[str] = []
    for count, one, many in (
        (years, "year", "years"),
        (months, "month", "months"),
        (days, "day", "days"),
        (hours, "h", "h"),
        (minutes, "m", "m"),
        (seconds, "s", "s"),
        (millis, "ms", "ms"),
        (micros, "us", "us"),
        (nanos, "ns", "ns"),
    ):
        if count:
            parts.append(f"{count}{one if count == 1 else many}")
    return " ".join(parts)


def duration_ns(value: object) -> int:
    """Nanoseconds of a humantime string, a number of seconds, or a ``timedelta``."""
    if isinstance(value, str):
        return parse_duration_ns(value)
    if isinstance(value, datetime.timedelta):
        ns = (value // datetime.timedelta(microseconds=1)) * 1_000
    elif isinstance(value, bool):
        raise ValueError("a bool is not a duration")
    elif isinstance(value, numbers.Integral):
        ns = int(value) * NS
    elif isinstance(value, numbers.Real):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ValueError("duration must be finite")
        ns = round(Fraction(seconds) * NS)  # Fraction: exact, so 0.1 s is exactly 100 ms
    else:
        raise ValueError(f"not a duration: {type(value).__name__}")
    if ns < 0:
        raise ValueError("duration must not be negative")
    return ns


def parse_duration(value: str | float | datetime.timedelta) -> float:
    """Seconds in a humantime string (``"1h 30m"``, ``"500ms"``), number or ``timedelta``.

    Raises ValueError for anything else, and for negative or non-finite durations.
    """
    return duration_ns(value) / NS


def format_duration(seconds: float) -> str:
    """Humantime text for ``seconds``, rounded to the nanosecond: ``format_duration(300) == "5m"``.

    ``parse_duration(format_duration(x)) == x`` for every ``x`` that is a whole number of
    nanoseconds below ~52 days (where a float still resolves single nanoseconds).
    """
    return format_duration_ns(duration_ns(seconds))


_SIZE_RE: Final = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]*)\s*")
_SIZE_UNITS: Final[dict[str, int]] = {
    "": 1,
    "b": 1,
    **{
        unit: 1000**power
        for power, prefix in enumerate("kmgtp", start=1)
        for unit in (prefix, f"{prefix}b")
    },
    **{f"{prefix}ib": 1024**power for power, prefix in enumerate("kmgtp", start=1)},
}


def parse_byte_size(text: str) -> int:
    """Bytes in ``"10GiB"`` (IEC, powers of 1024), ``"1GB"``/``"1G"`` (SI) or ``"4096"``."""
    m = _SIZE_RE.fullmatch(text)
    if m is None or (mult := _SIZE_UNITS.get(m.group(2).lower())) is None:
        raise ValueError(
            f"invalid byte size {text!r} (expected e.g. 4096, '64MiB', '10GiB', '1GB')"
        )
    size = Fraction(m.group(1)) * mult
    if size.denominator != 1:
        raise ValueError(f"byte size {text!r} is not a whole number of bytes")
    return int(size)
