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
