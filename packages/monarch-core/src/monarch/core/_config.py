"""Monarch's layered configuration: a typed key registry, four layers, and a cached snapshot.

Layers, lowest to highest: defaults < environment variables < TOML file (path in
``MONARCH_CONFIG_FILE``) < runtime (``configure``). Environment and file are read once, at import
(``reload_from_environment`` re-reads them), because children get their configuration through
the environment they are started with and nothing should change under a running proc by itself.

Values live in three forms:

* the *layer* form, what the layers store (durations as integer nanoseconds, so nothing drifts);
* the *public* form, what ``get_global_config`` returns, matching upstream: durations are
  normalised humantime strings (``"300s"`` reads back as ``"5m"``), sizes are ints,
  ``default_encoding`` is an ``Encoding``, ``default_transport`` a canonical string;
* the *snapshot* form, attributes of the frozen ``Config`` that ``current_config()`` returns
  (durations as float seconds), which hot paths read once per message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import enum
import functools
import inspect
import itertools
import logging
import math
import numbers
import operator
import os
import re
import threading
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Final, Generic, SupportsIndex, TypeVar

__all__ = [
    "CONFIG_FILE_ENV",
    "KEYS",
    "Config",
    "Encoding",
    "Key",
    "clear_runtime_config",
    "config_version",
    "configure",
    "configured",
    "current_config",
    "format_duration",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
    "parse_byte_size",
    "parse_duration",
    "reload_from_environment",
    "runtime_env",
]

_log = logging.getLogger("monarch.config")

CONFIG_FILE_ENV: Final = "MONARCH_CONFIG_FILE"
"""Environment variable naming the optional TOML file layer (top-level ``key = value`` pairs)."""

V = TypeVar("V")
_F = TypeVar("_F", bound=Callable[..., Any])


class Encoding(enum.Enum):
    """Wire encoding of message bodies (upstream ``Encoding``); values are upstream's env names."""

    Bincode = "bincode"
    Json = "serde_json"
    Multipart = "serde_multipart"


# --------------------------------------------------------------------------------------------
# Durations (humantime syntax) and byte sizes


_NS: Final = 1_000_000_000
_YEAR_S: Final = 31_557_600  # 365.25 days, as humantime counts them
_MONTH_S: Final = 2_630_016  # 30.44 days, as humantime counts them

_UNIT_NS: Final[dict[str, int]] = {
    **dict.fromkeys(("ns", "nsec", "nanos"), 1),
    **dict.fromkeys(("us", "usec", "µs", "μs", "micros"), 1_000),
    **dict.fromkeys(("ms", "msec", "millis"), 1_000_000),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), _NS),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60 * _NS),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600 * _NS),
    **dict.fromkeys(("d", "day", "days"), 86_400 * _NS),
    **dict.fromkeys(("w", "week", "weeks"), 7 * 86_400 * _NS),
    **dict.fromkeys(("M", "month", "months"), _MONTH_S * _NS),
    **dict.fromkeys(("y", "year", "years"), _YEAR_S * _NS),
}
_NUMBER: Final = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_NUMBER_RE: Final = re.compile(rf"\s*({_NUMBER})\s*")
_TERM_RE: Final = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Zµμ]+)")


class _Invalid(Exception):
    """A value a kind cannot accept; callers turn it into TypeError (configure) or a warning."""


def _unit_ns(unit: str) -> int:
    ns = _UNIT_NS.get(unit)
    if ns is None and len(unit) > 1:  # "M" (month) vs "m" (minute) is the only case that matters
        ns = _UNIT_NS.get(unit.lower())
    if ns is None:
        raise _Invalid(f"unknown time unit {unit!r}")
    return ns


def _parse_duration_ns(text: str) -> int:
    """Parse humantime (``"1h 30m"``, ``"500ms"``) or a plain number of seconds to nanoseconds."""
    plain = _PLAIN_NUMBER_RE.fullmatch(text)
    if plain is not None:
        return round(Fraction(plain.group(1)) * _NS)
    total = Fraction(0)
    pos, end = 0, len(text.rstrip())
    if end == 0:
        raise _Invalid("empty duration")
    while pos < end:
        term = _TERM_RE.match(text, pos)
        if term is None:
            raise _Invalid(f"invalid duration {text!r} (expected e.g. '30s', '500ms', '1h 30m')")
        total += Fraction(term.group(1)) * _unit_ns(term.group(2))
        pos = term.end()
    return round(total)


def _format_duration_ns(ns: int) -> str:
    """Format nanoseconds the way humantime does, largest unit first (``300s`` -> ``"5m"``)."""
    if ns == 0:
        return "0s"
    secs, nanos = divmod(ns, _NS)
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


def _duration_ns(value: object) -> int:
    """Nanoseconds of a humantime string, a number of seconds, or a ``timedelta``."""
    if isinstance(value, str):
        return _parse_duration_ns(value)
    if isinstance(value, datetime.timedelta):
        ns = (value // datetime.timedelta(microseconds=1)) * 1_000
    elif isinstance(value, bool):
        raise _Invalid("a bool is not a duration")
    elif isinstance(value, numbers.Integral):
        ns = int(value) * _NS
    elif isinstance(value, numbers.Real):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise _Invalid("duration must be finite")
        ns = round(Fraction(seconds) * _NS)  # Fraction: exact, so 0.1 s is exactly 100 ms
    else:
        raise _Invalid(f"not a duration: {type(value).__name__}")
    if ns < 0:
        raise _Invalid("duration must not be negative")
    return ns


def parse_duration(value: str | float | datetime.timedelta) -> float:
    """Seconds in a humantime string (``"1h 30m"``, ``"500ms"``), number or ``timedelta``.

    Raises ValueError for anything else, and for negative or non-finite durations.
    """
    try:
        return _duration_ns(value) / _NS
    except _Invalid as e:
        raise ValueError(str(e)) from None


def format_duration(seconds: float) -> str:
    """Humantime text for ``seconds``, rounded to the nanosecond: ``format_duration(300) == "5m"``.

    ``parse_duration(format_duration(x)) == x`` for every ``x`` that is a whole number of
    nanoseconds below ~52 days (where a float still resolves single nanoseconds).
    """
    try:
        return _format_duration_ns(_duration_ns(seconds))
    except _Invalid as e:
        raise ValueError(str(e)) from None


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


def _parse_size(text: str) -> int:
    m = _SIZE_RE.fullmatch(text)
    if m is None or (mult := _SIZE_UNITS.get(m.group(2).lower())) is None:
        raise _Invalid(f"invalid byte size {text!r} (expected e.g. 4096, '64MiB', '10GiB', '1GB')")
    size = Fraction(m.group(1)) * mult
    if size.denominator != 1:
        raise _Invalid(f"byte size {text!r} is not a whole number of bytes")
    return int(size)


def parse_byte_size(text: str) -> int:
    """Bytes in ``"10GiB"`` (IEC, powers of 1024), ``"1GB"``/``"1G"`` (SI) or ``"4096"``."""
    try:
        return _parse_size(text)
    except _Invalid as e:
        raise ValueError(str(e)) from None


# --------------------------------------------------------------------------------------------
# Kinds: how a key's values are checked, parsed and shown


class _Kind(Generic[V]):
    """A value type of the registry: validation (configure, TOML) and parsing (env, TOML)."""

    expected: str = "a value"

    def coerce(self, value: object) -> V:
        """Layer form of a Python value given to ``configure`` (strict: no str for an int)."""
        raise NotImplementedError

    def parse_text(self, text: str) -> V:
        """Layer form of an environment variable's text (lenient: ``"true"``, ``"30s"``)."""
        raise NotImplementedError

    def public(self, value: V) -> object:
        """What ``get_global_config`` shows; ``coerce(public(v)) == v``."""
        return value

    def snapshot(self, value: V) -> object:
        """What ``Config`` attributes hold, the form cheapest to use on hot paths."""
        return value

    def text(self, value: V) -> str:
        """Environment-variable form; ``parse_text(text(v)) == v``."""
        return str(value)


class _Bool(_Kind[bool]):
    expected = "a bool"
    _TRUE: Final = frozenset({"1", "true", "t", "yes", "y", "on"})
    _FALSE: Final = frozenset({"0", "false", "f", "no", "n", "off"})

    def coerce(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise _Invalid(f"not a bool: {type(value).__name__}")
        return value

    def parse_text(self, text: str) -> bool:
        word = text.strip().lower()
        if word in self._TRUE:
            return True
        if word in self._FALSE:
            return False
        raise _Invalid(f"not a boolean: {text!r} (use true/false, 1/0, yes/no, on/off)")

    def text(self, value: bool) -> str:
        return "true" if value else "false"


class _Int(_Kind[int]):
    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum
        self.expected = f"an int >= {minimum}"

    def _check(self, value: int) -> int:
        if value < self.minimum:
            raise _Invalid(f"{value} is below the minimum {self.minimum}")
        return value

    def coerce(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, SupportsIndex):
            raise _Invalid(f"not an int: {type(value).__name__}")
        return self._check(operator.index(value))

    def parse_text(self, text: str) -> int:
        try:
            return self._check(int(text, 10))
        except ValueError:
            raise _Invalid(f"not an integer: {text!r}") from None


class _Bytes(_Int):
    """A size in bytes: an int, or (anywhere) a size string such as ``"10GiB"``."""

    def __init__(self, minimum: int = 0) -> None:
        super().__init__(minimum)
        self.expected = f"a byte size >= {minimum} (an int, or a string such as '64MiB')"

    def coerce(self, value: object) -> int:
        if isinstance(value, str):
            return self.parse_text(value)
        return super().coerce(value)

    def parse_text(self, text: str) -> int:
        return self._check(_parse_size(text))


class _Float(_Kind[float]):
    def __init__(self, minimum: float = 0.0, maximum: float = math.inf) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.expected = f"a float in [{minimum}, {maximum}]"

    def _check(self, value: float) -> float:
        if not (self.minimum <= value <= self.maximum):  # also rejects NaN
            raise _Invalid(f"{value} is outside [{self.minimum}, {self.maximum}]")
        return value

    def coerce(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise _Invalid(f"not a number: {type(value).__name__}")
        return self._check(float(value))

    def parse_text(self, text: str) -> float:
        try:
            return self._check(float(text))
        except ValueError:
            raise _Invalid(f"not a number: {text!r}") from None

    def text(self, value: float) -> str:
        return repr(value)


class _Str(_Kind[str]):
    expected = "a str"

    def coerce(self, value: object) -> str:
        if not isinstance(value, str):
            raise _Invalid(f"not a str: {type(value).__name__}")
        return value

    def parse_text(self, text: str) -> str:
        return text


class _Duration(_Kind[int]):
    """Layer form: integer nanoseconds; public: humantime string; snapshot: float seconds."""

    expected = "a duration (a humantime string such as '30s', '500ms', '1h 30m', or seconds)"

    def coerce(self, value: object) -> int:
        return _duration_ns(value)

    def parse_text(self, text: str) -> int:
        return _duration_ns(text)

    def public(self, value: int) -> str:
        return _format_duration_ns(value)

    def snapshot(self, value: int) -> float:
        return value / _NS

    def text(self, value: int) -> str:
        return _format_duration_ns(value)


class _EncodingKind(_Kind[Encoding]):
    expected = "an Encoding (Encoding.Bincode, Encoding.Json, Encoding.Multipart)"
    _NAMES: Final[dict[str, Encoding]] = {
        **{e.name.lower(): e for e in Encoding},
        **{e.value: e for e in Encoding},
        "json": Encoding.Json,
        "multipart": Encoding.Multipart,
    }

    def coerce(self, value: object) -> Encoding:
        if isinstance(value, Encoding):
            return value
        if isinstance(value, str):
            return self.parse_text(value)
        raise _Invalid(f"not an Encoding: {type(value).__name__}")

    def parse_text(self, text: str) -> Encoding:
        word = text.strip().lower().removeprefix("encoding.")
        try:
            return self._NAMES[word]
        except KeyError:
            raise _Invalid(f"unknown encoding {text!r}") from None

    def text(self, value: Encoding) -> str:
        return value.value


class _Transport(_Kind[str]):
    """Canonical names: ``unix``, ``tcp``, ``tls``, ``local``, or an explicit ``scheme://addr``.

    Upstream's ``ChannelTransport`` members (or anything with such a ``name``) map onto them:
    ``Unix`` -> ``unix``, ``TcpWithHostname`` -> ``tcp``, ``TcpWithLocalhost`` ->
    ``tcp://127.0.0.1:0``, ``Tls``/``MetaTls*`` -> ``tls``, ``Local`` -> ``local``.
    """

    expected = (
        "a transport ('unix', 'ipc', 'tcp', 'tls', 'local', 'scheme://address' "
        "or a ChannelTransport)"
    )
    _ALIASES: Final[dict[str, str]] = {
        "unix": "unix",
        "ipc": "unix",
        "tcp": "tcp",
        "tcpwithhostname": "tcp",
        "tcpwithlocalhost": "tcp://127.0.0.1:0",
        "tls": "tls",
        "metatls": "tls",
        "metatlshostname": "tls",
        "metatlswithhostname": "tls",
        "metatlswithipaddr": "tls",
        "local": "local",
    }
    _SCHEME_RE: Final = re.compile(r"[a-z][a-z0-9+.\-]*")

    def coerce(self, value: object) -> str:
        if isinstance(value, str):
            return self.parse_text(value)
        name = value.name if isinstance(value, enum.Enum) else getattr(value, "name", None)
        if not isinstance(name, str):
            name = repr(value)  # pyo3 enums print as "ChannelTransport.Unix"
        return self.parse_text(name)

    def parse_text(self, text: str) -> str:
        word = text.strip()
        scheme, sep, rest = word.partition("://")
        if sep:
            scheme = scheme.lower()
            if not self._SCHEME_RE.fullmatch(scheme) or not rest:
                raise _Invalid(f"invalid transport address {text!r}")
            return f"{scheme}://{rest}"
        key = word.rsplit(".", 1)[-1].lower().replace("_", "").replace("-", "")
        try:
            return self._ALIASES[key]
        except KeyError:
            raise _Invalid(f"unknown transport {text!r}") from None


_BOOL: Final = _Bool()
_DURATION: Final = _Duration()
_STR: Final = _Str()


# --------------------------------------------------------------------------------------------
# The registry: one dataclass field per key, so the snapshot class and the key table agree


@dataclasses.dataclass(frozen=True)
class Key:
    """One configuration key: its type, default, environment variables and meaning."""

    name: str
    kind: _Kind[Any] = dataclasses.field(repr=False)
    default: Any = dataclasses.field(repr=False)  # layer form
    env: tuple[str, ...]  # first set one wins; env[0] is the name ``runtime_env`` writes
    doc: str
    ours: bool  # a key this project added (upstream has no such key)

    @property
    def type_name(self) -> str:
        """Readable type, for docs and errors."""
        return self.kind.expected

    @property
    def default_value(self) -> object:
        """The default in public form, as ``get_global_config`` would show it."""
        return self.kind.public(self.default)


_META: Final = "monarch.config"


def _aliases(env: tuple[str, ...]) -> tuple[str, ...]:
    """Add the other spelling of each HYPERACTOR_ name (with and without ``MESH_``)."""
    out = list(env)
    for name in env:
        if name.startswith("HYPERACTOR_MESH_"):
            out.append("HYPERACTOR_" + name.removeprefix("HYPERACTOR_MESH_"))
        elif name.startswith("HYPERACTOR_"):
            out.append("HYPERACTOR_MESH_" + name.removeprefix("HYPERACTOR_"))
    return tuple(dict.fromkeys(out))


def _key(kind: _Kind[Any], default: object, *env: str, doc: str, ours: bool = False) -> Any:
    """Declare a key as a ``Config`` field; the registry reads the metadata back."""
    value = kind.coerce(default)
    spec = (kind, value, _aliases(env), doc, ours)
    return dataclasses.field(default=kind.snapshot(value), metadata={_META: spec})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Frozen, attribute-access view of the merged configuration (see ``current_config``).

    Durations are float seconds, sizes int bytes. Keys marked "ours" are not upstream's.
    """

    # transport and wire
    default_transport: str = _key(
        _Transport(),
        "unix",
        "HYPERACTOR_MESH_DEFAULT_TRANSPORT",
        "HYPERACTOR_DEFAULT_TRANSPORT",
        "MONARCH_TRANSPORT",
        doc="Channel transport for procs' addresses (enable_transport).",
    )
    codec_max_frame_length: int = _key(
        _Bytes(1),
        10 * 1024**3,
        "HYPERACTOR_CODEC_MAX_FRAME_LENGTH",
        doc="Largest message accepted on a connection, in bytes; larger frames close it.",
    )
    default_encoding: Encoding = _key(  # noqa: RUF009 (Encoding members are immutable)
        _EncodingKind(),
        Encoding.Multipart,
        "HYPERACTOR_DEFAULT_ENCODING",
        doc="Wire encoding of message bodies.",
    )
    small_write_threshold: int = _key(
        _Bytes(0),
        256,
        "MONARCH_HYPERACTOR_SMALL_WRITE_THRESHOLD",
        doc="Buffers below this many bytes are copied into the frame, larger ones sent as-is.",
    )
    # messages
    message_delivery_timeout: float = _key(
        _DURATION,
        "30s",
        "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
        doc="A message not delivered within this is returned as undeliverable.",
    )
    message_ack_time_interval: float = _key(
        _DURATION,
        "500ms",
        "HYPERACTOR_MESSAGE_ACK_TIME_INTERVAL",
        doc="Channel acknowledgement period.",
    )
    message_ack_every_n_messages: int = _key(
        _Int(1),
        1000,
        "HYPERACTOR_MESSAGE_ACK_EVERY_N_MESSAGES",
        doc="Acknowledge at least every N messages.",
    )
    message_ttl_default: int = _key(
        _Int(1),
        64,
        "HYPERACTOR_MESSAGE_TTL_DEFAULT",
        doc="Hops a message may take before it is dropped as looping.",
    )
    split_max_buffer_size: int = _key(
        _Int(0),
        5,
        "HYPERACTOR_SPLIT_MAX_BUFFER_SIZE",
        doc="Fragments buffered while splitting/reassembling messages.",
    )
    split_max_buffer_age: float = _key(
        _DURATION,
        "50ms",
        "HYPERACTOR_SPLIT_MAX_BUFFER_AGE",
        doc="Longest a split-message buffer waits before it is flushed.",
    )
    channel_net_rx_buffer_full_check_interval: float = _key(
        _DURATION,
        "5s",
        "HYPERACTOR_CHANNEL_NET_RX_BUFFER_FULL_CHECK_INTERVAL",
        doc="How often a full receive buffer is re-checked.",
    )
    message_latency_sampling_rate: float = _key(
        _Float(0.0, 1.0),
        0.01,
        "HYPERACTOR_MESSAGE_LATENCY_SAMPLING_RATE",
        doc="Fraction of messages whose latency is recorded.",
    )
    enable_dest_actor_reordering_buffer: bool = _key(
        _BOOL,
        True,
        "HYPERACTOR_ENABLE_DEST_ACTOR_REORDERING_BUFFER",
        doc="Restore per-sender order at the destination actor.",
    )
    actor_queue_dispatch: bool = _key(
        _BOOL,
        True,
        "HYPERACTOR_ACTOR_QUEUE_DISPATCH",
        doc="Dispatch actor messages through a queue rather than directly.",
    )
    # casting
    max_cast_dimension_size: int = _key(
        _Int(1),
        16,
        "HYPERACTOR_MESH_MAX_CAST_DIMENSION_SIZE",
        doc="Largest mesh dimension a cast covers in one step of the tree.",
    )
    max_cast_fanout: int = _key(
        _Int(1),
        16,
        "HYPERACTOR_MESH_MAX_CAST_FANOUT",
        doc="Children per node of the multicast forwarding tree.",
    )
    # spawning, stopping, supervision
    host_spawn_ready_timeout: float = _key(
        _DURATION,
        "30s",
        "HYPERACTOR_HOST_SPAWN_READY_TIMEOUT",
        doc="Longest wait for a spawned host to become ready.",
    )
    mesh_proc_spawn_max_idle: float = _key(
        _DURATION,
        "30s",
        "HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE",
        doc="Longest silence between status updates while spawning procs.",
    )
    actor_spawn_max_idle: float = _key(
        _DURATION,
        "30s",
        "HYPERACTOR_MESH_ACTOR_SPAWN_MAX_IDLE",
        doc="Longest silence between status updates while spawning actors.",
    )
    get_actor_state_max_idle: float = _key(
        _DURATION,
        "1m",
        "HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE",
        doc="Longest wait for an actor state query.",
    )
    proc_stop_max_idle: float = _key(
        _DURATION,
        "30s",
        "HYPERACTOR_MESH_PROC_STOP_MAX_IDLE",
        doc="Longest silence between status updates while stopping procs.",
    )
    get_proc_state_max_idle: float = _key(
        _DURATION,
        "1m",
        "HYPERACTOR_MESH_GET_PROC_STATE_MAX_IDLE",
        doc="Longest wait for a proc state query.",
    )
    stop_actor_timeout: float = _key(
        _DURATION,
        "10s",
        "HYPERACTOR_STOP_ACTOR_TIMEOUT",
        doc="Budget for an actor to stop gracefully.",
    )
    cleanup_timeout: float = _key(
        _DURATION,
        "3s",
        "HYPERACTOR_CLEANUP_TIMEOUT",
        doc="Budget for an actor's __cleanup__.",
    )
    process_exit_timeout: float = _key(
        _DURATION,
        "10s",
        "HYPERACTOR_PROCESS_EXIT_TIMEOUT",
        doc="Wait for a process to exit before it is killed.",
    )
    mesh_terminate_timeout: float = _key(
        _DURATION,
        "10s",
        "HYPERACTOR_MESH_TERMINATE_TIMEOUT",
        doc="Per-child budget for graceful termination.",
    )
    mesh_terminate_concurrency: int = _key(
        _Int(1),
        16,
        "HYPERACTOR_MESH_TERMINATE_CONCURRENCY",
        doc="Children terminated at once during shutdown.",
    )
    supervision_watchdog_timeout: float = _key(
        _DURATION,
        "2m",
        "HYPERACTOR_MESH_SUPERVISION_WATCHDOG_TIMEOUT",
        doc="Silence on the supervision stream after which the controller counts as unreachable.",
    )
    mesh_attach_config_timeout: float = _key(
        _DURATION,
        "10s",
        "HYPERACTOR_MESH_ATTACH_CONFIG_TIMEOUT",
        doc="Budget for pushing configuration to workers in attach_to_workers.",
    )
    mesh_bootstrap_enable_pdeathsig: bool = _key(
        _BOOL,
        True,
        "HYPERACTOR_MESH_BOOTSTRAP_ENABLE_PDEATHSIG",
        doc="Children get a parent-death signal, so none outlives its parent.",
    )
    heartbeat_interval: float = _key(
        _DURATION,
        "1s",
        "MONARCH_HEARTBEAT_INTERVAL",
        doc="(ours) Period of host/proc liveness heartbeats.",
        ours=True,
    )
    heartbeat_timeout: float = _key(
        _DURATION,
        "5s",
        "MONARCH_HEARTBEAT_TIMEOUT",
        doc="(ours) A peer silent this long is declared dead.",
        ours=True,
    )
    read_peer_buffers: bool = _key(
        _BOOL,
        True,
        "MONARCH_READ_PEER_BUFFERS",
        doc=(
            "(ours) Processes of one machine read each other's large buffers directly "
            "(process_vm_readv, one copy) where allowed, instead of through the socket."
        ),
        ours=True,
    )
    wait_spin: float = _key(
        _DURATION,
        "300us",
        "MONARCH_WAIT_SPIN",
        doc=(
            "(ours) How long a waiting thread yields the CPU before it sleeps: replies and "
            "calls that come sooner skip a wake-up. A process's event loop after it handled "
            "messages, an idle sync actor's thread (one per process), and a thread blocking "
            "on a Future when fewer processes must answer than there are CPUs (else it would "
            "take a CPU they need). 0 to sleep at once."
        ),
        ours=True,
    )
    procs_per_process: int = _key(
        _Int(1),
        1,
        "MONARCH_PROCS_PER_PROCESS",
        doc=(
            "(ours) Procs of a spawn_procs mesh that share one OS process: simulates a large "
            "mesh (e.g. 8 x 128) on a small machine; each proc still gets its own actors."
        ),
        ours=True,
    )
    # logging
    enable_log_forwarding: bool = _key(
        _BOOL,
        False,
        "HYPERACTOR_MESH_ENABLE_LOG_FORWARDING",
        doc="Forward children's stdout/stderr through the mesh.",
    )
    enable_file_capture: bool = _key(
        _BOOL,
        False,
        "HYPERACTOR_MESH_ENABLE_FILE_CAPTURE",
        doc="Persist children's output to per-host files.",
    )
    tail_log_lines: int = _key(
        _Int(0),
        0,
        "HYPERACTOR_MESH_TAIL_LOG_LINES",
        doc="Recent output lines kept in memory per process.",
    )
    read_log_buffer: int = _key(
        _Int(0),
        100,
        "HYPERACTOR_READ_LOG_BUFFER",
        doc="Buffer size used when reading children's logs.",
    )
    force_file_log: bool = _key(
        _BOOL,
        False,
        "HYPERACTOR_FORCE_FILE_LOG",
        doc="Log to a file regardless of the environment.",
    )
    prefix_with_rank: bool = _key(
        _BOOL,
        True,
        "HYPERACTOR_PREFIX_WITH_RANK",
        doc="Prefix forwarded log lines with the rank.",
    )
    # admin
    mesh_admin_addr: str = _key(
        _STR,
        "[::]:1729",
        "HYPERACTOR_MESH_ADMIN_ADDR",
        doc="Bind address of the mesh admin HTTP server.",
    )
    pyspy_bin: str = _key(
        _STR,
        "",
        "PYSPY_BIN",
        doc="py-spy executable used by the admin server ('' = look it up on PATH).",
    )
    # rdma
    rdma_allow_tcp_fallback: bool = _key(
        _BOOL,
        True,
        "MONARCH_RDMA_ALLOW_TCP_FALLBACK",
        doc="Without ibverbs, move RDMA buffers over TCP/shared memory instead of failing.",
    )
    rdma_disable_ibverbs: bool = _key(
        _BOOL,
        False,
        "MONARCH_RDMA_DISABLE_IBVERBS",
        doc="Ignore ibverbs devices even when present (forces the fallback).",
    )
    rdma_max_chunk_size_mb: int = _key(
        _Int(1),
        64,
        "MONARCH_RDMA_MAX_CHUNK_SIZE_MB",
        doc="Chunk size, in MiB, of fallback transfers.",
    )
    rdma_ibverbs_target: str = _key(
        _STR,
        "",
        "MONARCH_RDMA_IBVERBS_TARGET",
        doc="Device to use: 'cpu:<numa>', 'gpu:<ordinal>', 'nic:<name>' ('' = automatic).",
    )
    rdma_peer_device_affinity: str = _key(
        _STR,
        "",
        "MONARCH_RDMA_PEER_DEVICE_AFFINITY",
        doc="Which peer NICs a local NIC pairs with: 'any', 'match_name', 'groups:a,b|c,d'.",
    )
    rdma_max_nics_per_buffer: int = _key(
        _Int(0),
        1,
        "MONARCH_RDMA_MAX_NICS_PER_BUFFER",
        doc="NICs a buffer is registered on, at most (0 = every equally good NIC).",
    )
    rdma_min_stripe_size_kb: int = _key(
        _Int(1),
        512,
        "MONARCH_RDMA_MIN_STRIPE_SIZE_KB",
        doc="Smallest stripe, in KiB, when a transfer is striped across queue pairs.",
    )
    rdma_qps_per_cq: int = _key(
        _Int(1),
        64,
        "MONARCH_RDMA_QPS_PER_CQ",
        doc="Queue pairs sharing one completion queue.",
    )
    rdma_cq_poller_per_device: bool = _key(
        _BOOL,
        False,
        "MONARCH_RDMA_CQ_POLLER_PER_DEVICE",
        doc="One completion poller per device instead of one per completion queue.",
    )
    rdma_runtime_worker_threads: int = _key(
        _Int(1),
        4,
        "MONARCH_RDMA_RUNTIME_WORKER_THREADS",
        doc="Worker threads of the RDMA data plane (latched at first RDMA use).",
    )


def _build_keys() -> dict[str, Key]:
    keys: dict[str, Key] = {}
    for f in dataclasses.fields(Config):
        kind, default, env, doc, ours = f.metadata[_META]
        keys[f.name] = Key(f.name, kind, default, env, doc, ours)
    return keys


_KEYS: Final = _build_keys()
KEYS: Final[Mapping[str, Key]] = MappingProxyType(_KEYS)
"""Every configuration key, by name, in declaration order."""

_DEFAULTS: Final[dict[str, Any]] = {name: key.default for name, key in _KEYS.items()}


# --------------------------------------------------------------------------------------------
# Layers


class _State:
    """The mutable layers; every write holds ``lock`` and drops the cached snapshot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.env: dict[str, Any] = {}
        self.file: dict[str, Any] = {}
        self.runtime: dict[str, Any] = {}
        self.version = 0
        self.snapshot: Config | None = None

    def changed(self) -> None:
        """Call with ``lock`` held after any layer changed."""
        self.version += 1
        self.snapshot = None

    def merged(self) -> dict[str, Any]:
        """Call with ``lock`` held: the layer form of every key."""
        return {**_DEFAULTS, **self.env, **self.file, **self.runtime}


_state: Final = _State()


def _check(overrides: Mapping[str, object]) -> dict[str, Any]:
    """Layer form of ``configure`` arguments; raises before anything is applied."""
    checked: dict[str, Any] = {}
    for name, value in overrides.items():
        key = _KEYS.get(name)
        if key is None:
            close = difflib.get_close_matches(name, _KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"invalid configuration key {name!r}{hint}")
        if value is None:  # as upstream: a key passed as None is left as it is
            continue
        try:
            checked[name] = key.kind.coerce(value)
        except _Invalid as e:
            raise TypeError(
                f"configuration key {name!r} expects {key.kind.expected}, got {value!r}: {e}"
            ) from None
    return checked


def configure(**kwargs: object) -> None:
    """Set keys in the runtime layer (over defaults < environment < file).

    All-or-nothing: an unknown key raises ValueError ("invalid configuration key ..."), a value of
    the wrong type TypeError, and then nothing changes. Durations take humantime strings
    (``"30s"``, ``"1h 30m"``), seconds or a ``timedelta``; a key given as None is left unchanged.
    """
    updates = _check(kwargs)
    if updates:
        with _state.lock:
            _state.runtime.update(updates)
            _state.changed()


def get_global_config() -> dict[str, Any]:
    """Every key's merged value (defaults < env < file < runtime); a copy, safe to mutate."""
    with _state.lock:
        merged = _state.merged()
    return {name: _KEYS[name].kind.public(value) for name, value in merged.items()}


def get_runtime_config() -> dict[str, Any]:
    """Only the keys set with ``configure``; ``configure(**get_runtime_config())`` restores them."""
    with _state.lock:
        runtime = dict(_state.runtime)
    return {name: _KEYS[name].kind.public(value) for name, value in runtime.items()}


def clear_runtime_config() -> None:
    """Forget every ``configure`` override; environment, file and defaults stay."""
    with _state.lock:
        _state.runtime = {}
        _state.changed()


@contextlib.contextmanager
def configured(**overrides: object) -> Iterator[dict[str, Any]]:
    """Apply ``overrides`` for the block, yield the merged config, then restore the runtime layer.

    The restore happens even when the block raises. The runtime layer is process-global, so other
    threads see the overrides while the block runs: meant for tests and short scoped blocks.
    """
    with _state.lock:
        saved = dict(_state.runtime)
    try:
        configure(**overrides)
        yield get_global_config()
    finally:
        with _state.lock:
            _state.runtime = saved
            _state.changed()


def current_config() -> Config:
    """The merged configuration as a frozen ``Config``, rebuilt only after a change.

    Cheap enough to call per message: one attribute read while nothing changes.
    """
    snapshot = _state.snapshot
    if snapshot is not None:
        return snapshot
    with _state.lock:
        if _state.snapshot is None:
            fields: dict[str, Any] = {
                name: _KEYS[name].kind.snapshot(value) for name, value in _state.merged().items()
            }
            _state.snapshot = Config(**fields)
        return _state.snapshot


def config_version() -> int:
    """A counter that changes whenever any layer changes, for caches of derived values."""
    return _state.version


def runtime_env() -> dict[str, str]:
    """The runtime layer as environment variables, to start child processes with the same keys.

    In the child these land in its environment layer (below its own file layer, if any).
    """
    with _state.lock:
        runtime = dict(_state.runtime)
    return {_KEYS[name].env[0]: _KEYS[name].kind.text(value) for name, value in runtime.items()}


def _read_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The environment layer; a bad value is logged and skipped: this runs at import."""
    layer: dict[str, Any] = {}
    for key in _KEYS.values():
        for var in key.env:
            raw = environ.get(var)
            if raw is None:
                continue
            try:
                layer[key.name] = key.kind.parse_text(raw)
            except _Invalid as e:
                _log.warning(
                    "ignoring environment variable %s=%r: %s (expected %s)",
                    var,
                    raw,
                    e,
                    key.kind.expected,
                )
                continue
            break
    return layer


def _read_file(path: str) -> dict[str, Any]:
    """The TOML file layer (top-level ``key = value``); problems are logged and skipped."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        _log.warning("ignoring configuration file %s (from %s): %s", path, CONFIG_FILE_ENV, e)
        return {}
    layer: dict[str, Any] = {}
    for name, raw in data.items():
        key = _KEYS.get(name)
        if key is None:
            _log.warning("ignoring unknown key %r in configuration file %s", name, path)
            continue
        try:
            value = key.kind.parse_text(raw) if isinstance(raw, str) else key.kind.coerce(raw)
        except _Invalid as e:
            _log.warning(
                "ignoring %s = %r in configuration file %s: %s (expected %s)",
                name,
                raw,
                path,
                e,
                key.kind.expected,
            )
            continue
        layer[name] = value
    return layer


def reload_from_environment(environ: Mapping[str, str] | None = None) -> None:
    """Re-read the environment and file layers (``os.environ`` unless given); keeps runtime.

    Done once at import; call again after changing the environment (tests, embedding).
    """
    environ = os.environ if environ is None else environ
    env = _read_environment(environ)
    path = environ.get(CONFIG_FILE_ENV, "")
    file = _read_file(path) if path else {}
    with _state.lock:
        _state.env, _state.file = env, file
        _state.changed()


# --------------------------------------------------------------------------------------------
# pytest helpers (pytest is imported only when a decorator is applied)


def _values(values: Iterable[object]) -> list[object]:
    """A list of ``values``; sets sorted by repr so test ids are stable across runs."""
    if isinstance(values, set | frozenset):
        return sorted(values, key=repr)
    return list(values)


def _parametrize(cases: list[dict[str, object]]) -> Callable[[_F], _F]:
    """Parametrize a test over ``cases``, running each under ``configured(**case)``."""
    for case in cases:
        _check(case)  # a typo fails at collection, not inside every case
    ids = ["-".join(f"{k}={v}" for k, v in case.items()) for case in cases]

    def decorator(fn: _F) -> _F:
        import pytest

        sig = inspect.signature(fn)
        arg = "_config_overrides"
        while arg in sig.parameters:  # stacked decorators each get their own argument
            arg += "_"
        params = list(sig.parameters.values())
        at = next(
            (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
            len(params),
        )
        # Keyword-only at the end: pytest passes it by name, and a method's ``self`` stays first.
        params.insert(at, inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY))
        wrapper: Any
        if inspect.iscoroutinefunction(fn):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with configured(**kwargs.pop(arg)):
                    return await fn(*args, **kwargs)

            wrapper = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                with configured(**kwargs.pop(arg)):
                    return fn(*args, **kwargs)

            wrapper = sync_wrapper
        functools.update_wrapper(wrapper, fn)
        wrapper.__signature__ = sig.replace(parameters=params)
        marked: _F = pytest.mark.parametrize(arg, cases, ids=ids)(wrapper)
        return marked

    return decorator


def parametrize_config(**config_options: Iterable[object]) -> Callable[[_F], _F]:
    """Run a test under every combination (cross product) of the given values.

    ``@parametrize_config(actor_queue_dispatch={True, False}, tail_log_lines={0, 10})`` runs the
    test 4 times, each inside ``configured(...)``; sync and async tests alike.
    """
    if not config_options:
        raise ValueError("parametrize_config requires at least one config option")
    keys = list(config_options)
    combos = itertools.product(*(_values(v) for v in config_options.values()))
    return _parametrize([dict(zip(keys, combo, strict=True)) for combo in combos])


def parametrize_config_pointwise(**config_options: Iterable[object]) -> Callable[[_F], _F]:
    """Run a test once per position: the i-th case uses the i-th value of every key (a zip).

    ``@parametrize_config_pointwise(a=[1, 2], b=[True, False])`` runs ``(a=1, b=True)`` and
    ``(a=2, b=False)``; every list must have the same length.
    """
    if not config_options:
        raise ValueError("parametrize_config_pointwise requires at least one config option")
    columns = {key: _values(values) for key, values in config_options.items()}
    lengths = {key: len(values) for key, values in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"parametrize_config_pointwise needs equally long value lists: {lengths}")
    keys = list(columns)
    rows = zip(*columns.values(), strict=True)
    return _parametrize([dict(zip(keys, row, strict=True)) for row in rows])


reload_from_environment()
