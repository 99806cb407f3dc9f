"""One configuration key: its ``key(...)`` declaration, the spellings people write for its
value (``"30s"``, ``"64MiB"``, a ``ChannelTransport``), and its coercion between the layer,
public, snapshot and text forms (see ``_keys``)."""

from __future__ import annotations

import dataclasses
import decimal
import enum
import math
import numbers
import operator
import re
import struct
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal, SupportsIndex, TypeAlias

import msgspec

from ._units import NS, duration_ns, format_duration_ns, parse_byte_size, parse_humantime_ns


class Encoding(enum.Enum):
    """Wire encoding of message bodies (upstream ``Encoding``); values are upstream's env names."""

    Bincode = "bincode"
    Json = "serde_json"
    Multipart = "serde_multipart"

    def __repr__(self) -> str:
        return f"Encoding.{self.name}"


@dataclasses.dataclass(frozen=True)
class Spelling:
    """Annotation metadata: other ways to write a key's values, which msgspec alone rejects."""

    what: str  # the accepted values, for errors and docs; ``{ge}`` is the msgspec.Meta bound
    read: Callable[[Any], object]  # a value as written -> the annotated type; ValueError if not


def _builtin_number(value: object, base: type) -> object:
    """numpy scalars, IntEnums, Fractions as the builtin int/float msgspec checks; else as is.

    A Decimal is refused for a float: msgspec takes it, but it is no ``numbers.Real``.
    """
    if isinstance(value, bool):
        return value
    if base is int and isinstance(value, SupportsIndex):
        return operator.index(value)
    if base is float and isinstance(value, numbers.Real):
        return float(value)
    if base is float and isinstance(value, decimal.Decimal):
        raise ValueError("not a number: Decimal")
    return value


_ENCODING_NAMES: Final[dict[str, Encoding]] = {
    **{e.name.lower(): e for e in Encoding},
    **{e.value: e for e in Encoding},
    "json": Encoding.Json,
    "multipart": Encoding.Multipart,
}


# Canonical transports: unix, tcp, tls, local, or an explicit scheme://address. Upstream's
# ChannelTransport members map onto them: TcpWithLocalhost -> tcp://127.0.0.1:0, MetaTls*, Quic
# and MetaQuic* -> tls.
_TRANSPORTS: Final[dict[str, str]] = {
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
    "metatlswithipv6": "tls",
    "quic": "tls",  # QUIC is TLS-secured: ours is TLS over TCP
    "metaquicwithhostname": "tls",
    "metaquicwithipv6": "tls",
    "local": "local",
}


EVENT_LOOPS: Final = ("auto", "asyncio", "uvloop")
"""What ``event_loop`` may say: uvloop when installed, or one of the two."""


_SCHEME_RE: Final = re.compile(r"[a-z][a-z0-9+.\-]*")


def _to_f32(value: object) -> float:
    """``value`` as the nearest 32-bit float (as a Python float), as upstream keeps the key."""
    number = float(_builtin_number(value, float))  # type: ignore[arg-type]
    if not math.isfinite(number) or abs(number) > _F32_MAX:
        return number if not math.isfinite(number) else math.copysign(math.inf, number)
    return float(struct.unpack("f", struct.pack("f", number))[0])


_F32_MAX: Final = 3.4028234663852886e38


def _read_size(value: object) -> object:
    if isinstance(value, str):
        return parse_byte_size(value)
    return _builtin_number(value, int)


def _read_encoding(value: object) -> object:
    if isinstance(value, Encoding):
        return value
    if not isinstance(value, str):  # clearer than msgspec's "Expected `str`" (the values' type)
        raise ValueError(f"not an Encoding: {type(value).__name__}")
    try:
        return _ENCODING_NAMES[value.strip().lower().removeprefix("encoding.")]
    except KeyError:
        raise ValueError(f"unknown encoding {value!r}") from None


def _read_event_loop(value: object) -> str:
    word = value.strip().lower() if isinstance(value, str) else value
    if word not in EVENT_LOOPS:
        raise ValueError(f"unknown event loop {value!r}")
    return str(word)


def _read_transport(value: object) -> str:
    if isinstance(value, BindSpec):
        return value.transport
    if not isinstance(value, str):
        name = value.name if isinstance(value, enum.Enum) else getattr(value, "name", None)
        value = name if isinstance(name, str) else repr(value)  # pyo3 enums: "ChannelTransport.X"
    word = value.strip()
    if word in _BIND_WORDS:  # upstream's bind-spec words, as str(BindSpec) shows them
        return _BIND_WORDS[word]
    scheme, sep, rest = word.partition("://")
    if sep:
        scheme = scheme.lower()
        if not _SCHEME_RE.fullmatch(scheme) or not rest:
            raise ValueError(f"invalid transport address {value!r}")
        if scheme == "ipc":
            scheme = "unix"  # upstream's name of the same address
        return f"{scheme}://{rest}"
    alias = word.rsplit(".", 1)[-1].lower().replace("_", "").replace("-", "")
    try:
        return _TRANSPORTS[alias]
    except KeyError:
        raise ValueError(f"unknown transport {value!r}") from None


F32: Final = Spelling("a float (held as a 32-bit float, as upstream holds it)", _to_f32)


DURATION: Final = Spelling(
    "a duration (a humantime string such as '30s', '500ms', '1h 30m', or seconds)", duration_ns
)


BYTE_SIZE: Final = Spelling("a byte size >= {ge} (an int, or a string such as '64MiB')", _read_size)


ENCODING: Final = Spelling(
    "an Encoding (Encoding.Bincode, Encoding.Json, Encoding.Multipart)", _read_encoding
)


TRANSPORT: Final = Spelling(
    "a transport ('unix', 'tcp', 'tls', 'local', 'scheme://address', a ChannelTransport or a "
    "BindSpec; the environment and the file also read 'ipc')",
    _read_transport,
)


EVENT_LOOP: Final = Spelling("'auto', 'asyncio' or 'uvloop'", _read_event_loop)


# The key types. A duration's layer form is ``Nanoseconds``; ``Config`` holds float seconds.
Count: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]


Positive: TypeAlias = Annotated[int, msgspec.Meta(ge=1)]


Bytes: TypeAlias = Annotated[int, msgspec.Meta(ge=0), BYTE_SIZE]


Seconds: TypeAlias = Annotated[float, DURATION]


Nanoseconds: TypeAlias = Annotated[int, msgspec.Meta(ge=0)]


Byte: TypeAlias = Annotated[int, msgspec.Meta(ge=0, le=255)]


Float32: TypeAlias = Annotated[float, F32]


Transport: TypeAlias = Annotated[str, TRANSPORT]


_TRUE: Final = frozenset({"1", "true", "t", "yes", "y", "on"})


_FALSE: Final = frozenset({"0", "false", "f", "no", "n", "off"})


def _bool_from_text(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r} (use true/false, 1/0, yes/no, on/off)")


def _int_from_text(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"not an integer: {text!r}") from None


def _float_from_text(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None


# Environment text of a key with no Spelling, by type (a str key takes the text as it is).
_FROM_TEXT: Final[dict[type, Callable[[str], object]]] = {
    bool: _bool_from_text,
    int: _int_from_text,
    float: _float_from_text,
}


def _describe(tp: Any, spelling: Spelling | None) -> str:
    """The values a type accepts, in words: ``an int >= 1``, ``a float``, ``... or None``."""
    info = msgspec.inspect.type_info(tp)
    if isinstance(info, msgspec.inspect.UnionType):
        inner = next(t for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
        return f"{_describe_info(inner, spelling)} or None"
    return _describe_info(info, spelling)


def _describe_info(info: msgspec.inspect.Type, spelling: Spelling | None) -> str:
    ge = getattr(info, "ge", None)
    if spelling is not None:
        return spelling.what.format(ge=ge)
    if isinstance(info, msgspec.inspect.IntType):
        return f"an int >= {ge}" if info.le is None else f"an int in [{ge}, {info.le}]"
    if isinstance(info, msgspec.inspect.FloatType):
        return "a float"
    return "a bool" if isinstance(info, msgspec.inspect.BoolType) else "a str"


def _strip(tp: Any) -> tuple[Any, bool, float | None, float | None]:
    """A key type's base type, whether None is allowed, and its int bounds (ge, le)."""
    optional = False
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        optional = type(None) in typing.get_args(tp)
        tp = next(arg for arg in typing.get_args(tp) if arg is not type(None))
    ge = le = None
    if typing.get_origin(tp) is Annotated:
        for meta in tp.__metadata__:
            if isinstance(meta, msgspec.Meta):
                ge, le = meta.ge, meta.le
        tp = typing.get_args(tp)[0]
    return tp, optional, ge, le


Shows = Literal["str", "repr"]
"""How upstream's error for a key shows the refused value (it differs from key to key)."""


_U64_MAX: Final = 2**64 - 1


_C_LONG: Final = range(-(2**63), 2**63)


class _Refused(Exception):
    """Why upstream's ``configure`` refuses a value: the error it raises and its detail."""

    def __init__(self, kind: type[Exception], detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


def _cannot_cast(value: object, to: str) -> str:
    return f"'{type(value).__name__}' object cannot be cast as '{to}'"


def _is_bool(value: object) -> bool:
    """A bool, or numpy's (upstream takes both)."""
    kind = type(value)
    return kind is bool or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"))


def _real(value: object) -> float:
    """A float as CPython's ``PyFloat_AsDouble`` reads one (``__float__``, else ``__index__``)."""
    kind = type(value)
    if hasattr(kind, "__float__"):
        return float(value)  # type: ignore[arg-type]
    if hasattr(kind, "__index__"):
        return float(operator.index(value))  # type: ignore[arg-type]
    raise _Refused(TypeError, f"TypeError: must be real number, not {kind.__name__}")


def _unsigned(value: object, ge: float | None, le: float | None) -> int:
    """An int as upstream's unsigned keys take one: a u8 (``le`` 255) or a u64, non-zero when
    ``ge`` is 1."""
    if not isinstance(value, SupportsIndex):
        kind = type(value).__name__
        raise _Refused(TypeError, f"TypeError: '{kind}' object cannot be interpreted as an integer")
    number = operator.index(value)
    if le == 255:
        if number not in _C_LONG:
            raise _Refused(TypeError, "OverflowError: Python int too large to convert to C long")
        if not 0 <= number <= 255:
            raise _Refused(
                TypeError, "OverflowError: out of range integral type conversion attempted"
            )
    elif number < 0:
        raise _Refused(TypeError, "OverflowError: can't convert negative int to unsigned")
    elif number > _U64_MAX:
        raise _Refused(TypeError, "OverflowError: int too big to convert")
    if ge == 1 and number == 0:
        raise _Refused(ValueError, "expected non-zero usize")
    return number


def _check_transport(value: object) -> str:
    """``configure(default_transport=...)``: a ChannelTransport, a BindSpec or a str, as
    upstream takes them (its bind-spec words and addresses; not ``enable_transport``'s
    shortcuts such as ``"ipc"``, which upstream's configure refuses too)."""
    if isinstance(value, BindSpec):
        return value.transport
    if isinstance(value, str):
        return _bind_spec_transport(value)
    if type(value).__name__ == "ChannelTransport" and isinstance(getattr(value, "name", None), str):
        try:
            return _read_transport(value)
        except ValueError:
            raise TypeError(f"default_transport: {value!r} is not supported here") from None
    raise TypeError("expected ChannelTransport enum, BindSpec, or str")


_BIND_WORDS: Final[dict[str, str]] = {
    "unix": "unix",
    "tcp": "tcp",
    "tls": "tls",
    "local": "local",
    "quic": "tls",
    "tcp(Hostname)": "tcp",
    "tcp(Localhost)": "tcp://127.0.0.1:0",
    "metatls(Hostname)": "tls",
    "metatls(IpV6)": "tls",
    "metaquic(Hostname)": "tls",
    "metaquic(IpV6)": "tls",
    "ibverbs": "ibverbs",  # ours: monarch-rdma's transport (TCP, large parts by RDMA)
}
"""Upstream's bind-spec words (``str(BindSpec(ChannelTransport.X))``) and our transport for each."""


_BIND_SCHEMES: Final[dict[str, str]] = {
    "tcp": "tcp",
    "tls": "tls",
    "metatls": "tls",
    "unix": "unix",
    "ipc": "unix",
    "ibverbs": "ibverbs",
}
"""Schemes of upstream's bind-spec addresses (``tcp://host:port``, ``unix:path``) and ours."""


_HOST_PORT_RE: Final = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(\d{1,5})")


def _bind_spec_transport(text: str) -> str:
    """Our transport for a string upstream's ``BindSpec`` takes; its ValueError if it would not."""
    word = _BIND_WORDS.get(text)
    if word is not None:
        return word
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, sep, rest = text.partition(":")
    ours = _BIND_SCHEMES.get(scheme) if sep else None
    if ours == "unix" and rest:
        return f"unix://{rest}"
    if ours is not None and _HOST_PORT_RE.fullmatch(rest) and int(rest.rsplit(":", 1)[1]) < 65536:
        return f"{ours}://{rest}"
    raise ValueError(f"invalid str for BindSpec '{text}': invalid bind spec: {text}")


class BindSpec:
    """Upstream's ``default_transport`` value: how a proc binds its channel server.

    Built from a ``ChannelTransport``, another ``BindSpec`` or a string upstream's takes
    (``"unix"``, ``"tcp"``, ``"tcp://127.0.0.1:0"``, ``"ipc://path"``); shown, compared and
    refused as upstream's (equal only to an equal BindSpec, unhashable, not picklable).
    ``transport`` is ours: what the runtime listens on. Transports ours maps onto another
    (TcpWithLocalhost, the Meta and Quic kinds) show as the one used.
    """

    __slots__ = ("transport",)
    __hash__ = None  # type: ignore[assignment]  # upstream's is unhashable

    def __init__(self, spec: object) -> None:
        self.transport: str = _check_transport(spec)

    @classmethod
    def of(cls, transport: str) -> BindSpec:
        """The BindSpec of one of our transports (a layer form of ``default_transport``)."""
        spec = cls.__new__(cls)
        spec.transport = transport
        return spec

    def _shape(self) -> tuple[str, str]:
        """(the inside of upstream's repr, its str)."""
        transport = self.transport
        kinds = {
            "unix": "Unix",
            "tcp": "Tcp(Hostname)",
            "tls": "Tls",
            "local": "Local",
            "ibverbs": "Ibverbs",
        }
        if transport in kinds:
            shown = "tcp(Hostname)" if transport == "tcp" else transport
            return f"Any({kinds[transport]})", shown
        scheme, _, rest = transport.partition("://")
        if scheme == "unix":
            if rest.startswith("@"):
                return f'Addr(Unix(Bound("{rest[1:]}" (abstract))))', f"unix:{rest}"
            return f'Addr(Unix(Bound("{rest}" (pathname))))', f"unix:{rest}"
        if scheme == "tcp":
            return f"Addr(Tcp({rest}))", f"tcp:{rest}"
        if scheme == "tls":
            host, _, port = rest.rpartition(":")
            return f'Addr(Tls(TlsAddr {{ hostname: "{host}", port: {port} }}))', f"tls:{rest}"
        return f"Addr({scheme.capitalize()}({rest}))", f"{scheme}:{rest}"

    def __repr__(self) -> str:
        return f"PyBindSpec({self._shape()[0]})"

    def __str__(self) -> str:
        return self._shape()[1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BindSpec):
            return NotImplemented
        return self.transport == other.transport

    def __reduce__(self) -> Any:
        raise TypeError(f"cannot pickle '{_BINDSPEC_PATH}' object")


_BINDSPEC_PATH: Final = "monarch._rust_bindings.monarch_hyperactor.channel.BindSpec"


BindSpec.__module__ = _BINDSPEC_PATH.rpartition(".")[0]  # where users import it from, as upstream


@dataclasses.dataclass(frozen=True)
class Key:
    """One configuration key: its type, default, environment variables and meaning."""

    name: str
    type: Any = dataclasses.field(repr=False)  # of the layer form, as msgspec checks it
    spelling: Spelling | None = dataclasses.field(repr=False)
    default: Any = dataclasses.field(repr=False)  # layer form
    env: tuple[str, ...]  # first set one wins; env[0] is the name ``runtime_env`` writes
    doc: str
    ours: bool  # a key this project added (upstream has no such key)
    upstream: str = ""  # upstream's name of the key, in its errors (``hyperactor::config::x``)
    shows: Shows = "str"  # how upstream's errors show a refused value

    @property
    def type_name(self) -> str:
        """Readable type, for docs and errors."""
        return _describe(self.type, self.spelling)

    @property
    def default_value(self) -> object:
        """The default in public form, as ``get_global_config`` would show it."""
        return self.public(self.default)

    @property
    def _base(self) -> Any:
        return _strip(self.type)[0]

    def check(self, value: object) -> Any:
        """Layer form of a ``configure`` argument. Upstream's keys take what upstream's take and
        refuse the rest with its errors (TypeError, or ValueError for a zero that must not be);
        ours read values as ``coerce`` does (TypeError naming the key and what it takes)."""
        if self.spelling is TRANSPORT:
            return _check_transport(value)
        if not self.upstream:
            try:
                return self.coerce(value)
            except ValueError as e:  # msgspec.ValidationError included
                raise TypeError(
                    f"configuration key {self.name!r} expects {self.type_name}, got {value!r}: {e}"
                ) from None
        try:
            return self._as_upstream(value)
        except _Refused as refused:
            shown = repr(value) if self.shows == "repr" else str(value)
            raise refused.kind(
                f"invalid value `{shown}` for configuration key `{self.upstream}` "
                f"({refused.detail})"
            ) from None

    def _as_upstream(self, value: object) -> Any:
        base, optional, ge, le = _strip(self.type)
        if value is None and optional:
            return None
        if self.spelling is DURATION:
            if not isinstance(value, str):
                raise _Refused(TypeError, f"TypeError: {_cannot_cast(value, 'str')}")
            try:
                return parse_humantime_ns(value)
            except ValueError as e:
                raise _Refused(
                    TypeError, f"ValueError: Invalid duration format '{value}': {e}"
                ) from None
        if self.spelling is ENCODING:
            if not isinstance(value, Encoding):
                raise _Refused(TypeError, _cannot_cast(value, "Encoding"))
            return value
        if base is bool:
            if not _is_bool(value):
                raise _Refused(TypeError, f"TypeError: {_cannot_cast(value, 'bool')}")
            return bool(value)
        if base is str:
            if not isinstance(value, str):
                raise _Refused(TypeError, f"TypeError: {_cannot_cast(value, 'str')}")
            return str(value)
        if base is float:
            number = _real(value)
            return _to_f32(number) if self.spelling is F32 else number
        return _unsigned(value, ge, le)

    def coerce(self, value: object) -> Any:
        """Layer form of a Python value as the environment and TOML layers read one (more
        leniently than ``check``: ``"64MiB"``, seconds for a duration); ValueError if not."""
        if self.spelling is not None:
            value = self.spelling.read(value)
        else:
            value = _builtin_number(value, self._base)
        return msgspec.convert(value, self.type, strict=True)

    def parse_text(self, text: str) -> Any:
        """Layer form of an environment variable's text (``"true"``, ``"30s"``); ValueError."""
        if _strip(self.type)[1] and text.strip().lower() in ("", "none"):
            return None
        from_text = None if self.spelling is not None else _FROM_TEXT.get(self._base)
        return self.coerce(text if from_text is None else from_text(text))

    def public(self, value: Any) -> object:
        """What ``get_global_config`` shows; ``coerce(public(v)) == v``."""
        if self.spelling is TRANSPORT:
            return BindSpec.of(value)
        return format_duration_ns(value) if self.spelling is DURATION else value

    def snapshot(self, value: Any) -> object:
        """What ``Config`` attributes hold, the form cheapest to use on hot paths."""
        return value / NS if self.spelling is DURATION else value

    def text(self, value: Any) -> str:
        """Environment-variable form; ``parse_text(text(v)) == v``."""
        if self.spelling is DURATION:
            return format_duration_ns(value)
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, Encoding):
            return value.value
        if value is None:
            return "none"
        return str(value)


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


def key(
    default: object,
    *env: str,
    doc: str,
    ours: bool = False,
    upstream: str = "",
    shows: Shows = "str",
) -> Any:
    """A ``Config`` field: its default as ``Config`` holds it, environment variables, meaning;
    for upstream's keys, upstream's name of it and how its errors show a value."""
    metadata = {_META: (_aliases(env), doc, ours, upstream, shows)}
    return dataclasses.field(default=default, metadata=metadata)
