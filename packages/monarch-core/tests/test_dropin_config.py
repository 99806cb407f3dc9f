"""Drop-in behaviour of ``monarch.config`` and ``ChannelTransport``, as upstream's: defaults, the
values ``configure`` refuses and its errors (durations above all), transports.

Public API only: ``python integration/upstream_check.py`` runs this file under upstream
torchmonarch 0.7.0 to show the expectations are upstream's.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from monarch._rust_bindings.monarch_hyperactor.channel import BindSpec
from monarch.actor import ChannelTransport
from monarch.config import Encoding, clear_runtime_config, configure, get_global_config

# Every key both implementations have, with upstream's default as get_global_config() shows it
# (default_transport, a BindSpec upstream, is compared by its str).
UPSTREAM_DEFAULTS: dict[str, Any] = {
    "actor_spawn_max_idle": "30s",
    "channel_net_rx_buffer_full_check_interval": "5s",
    "cleanup_timeout": "3s",
    "codec_max_frame_length": 10737418240,
    "default_encoding": Encoding.Multipart,
    "default_transport": "unix",
    "enable_dest_actor_reordering_buffer": True,
    "enable_file_capture": False,
    "enable_log_forwarding": False,
    "force_file_log": False,
    "get_actor_state_max_idle": "30s",
    "get_proc_state_max_idle": "1m",
    "host_spawn_ready_timeout": "30s",
    "max_cast_dimension_size": 16,
    "max_cast_fanout": 16,
    "mesh_admin_addr": "[::]:1729",
    "mesh_attach_config_timeout": "1m",
    "mesh_bootstrap_enable_pdeathsig": True,
    "mesh_proc_spawn_max_idle": "30s",
    "mesh_terminate_concurrency": 16,
    "mesh_terminate_timeout": "10s",
    "message_ack_every_n_messages": 1000,
    "message_ack_time_interval": "500ms",
    "message_delivery_timeout": "30s",
    "message_latency_sampling_rate": 0.009999999776482582,  # 0.01 as a 32-bit float
    "message_ttl_default": 64,
    "prefix_with_rank": True,
    "proc_stop_max_idle": "30s",
    "process_exit_timeout": "10s",
    "pyspy_bin": "",
    "rdma_allow_tcp_fallback": True,
    "rdma_cq_poller_per_device": True,
    "rdma_disable_ibverbs": False,
    "rdma_ibverbs_target": "",
    "rdma_max_chunk_size_mb": 64,
    "rdma_max_nics_per_buffer": None,
    "rdma_min_stripe_size_kb": 512,
    "rdma_peer_device_affinity": "",
    "rdma_qps_per_cq": 64,
    "rdma_runtime_worker_threads": 4,
    "read_log_buffer": 100,
    "small_write_threshold": 256,
    "split_max_buffer_age": "50ms",
    "split_max_buffer_size": 5,
    "stop_actor_timeout": "10s",
    "supervision_watchdog_timeout": "2m",
    "tail_log_lines": 0,
}


@pytest.fixture(autouse=True)
def runtime_layer_cleared() -> Iterator[None]:
    clear_runtime_config()
    yield
    clear_runtime_config()


@pytest.mark.parametrize("key", sorted(UPSTREAM_DEFAULTS))
def test_defaults_are_upstreams(key: str) -> None:
    value = get_global_config()[key]
    if key == "default_transport":
        value = str(value)
    assert value == UPSTREAM_DEFAULTS[key]
    assert type(value) is type(UPSTREAM_DEFAULTS[key])


def test_encoding_shows_as_upstreams() -> None:
    assert repr(get_global_config()["default_encoding"]) == "Encoding.Multipart"
    assert [name for name in dir(Encoding) if not name.startswith("_")][:3] == [
        "Bincode",
        "Json",
        "Multipart",
    ]


# -- what configure refuses, and how -------------------------------------------------------------

DELIVERY = "hyperactor::config::message_delivery_timeout"
FANOUT = "hyperactor_mesh::config::max_cast_fanout"
TAIL = "hyperactor_mesh::bootstrap::mesh_tail_log_lines"
FORWARDING = "hyperactor_mesh::bootstrap::mesh_enable_log_forwarding"
RATE = "hyperactor::config::message_latency_sampling_rate"
ENCODING = "wirevalue::config::default_encoding"
ADMIN = "hyperactor_mesh::config::mesh_admin_addr"
FRAME = "hyperactor::config::codec_max_frame_length"
TTL = "hyperactor::config::message_ttl_default"
NICS = "monarch_rdma::config::rdma_max_nics_per_buffer"


def refused(shown: str, key: str, detail: str) -> str:
    return f"invalid value `{shown}` for configuration key `{key}` ({detail})"


@pytest.mark.parametrize(
    ("key", "value", "error", "message"),
    [
        # a duration is a humantime str: no numbers, no None
        (
            "message_delivery_timeout",
            5,
            TypeError,
            refused("5", DELIVERY, "TypeError: 'int' object cannot be cast as 'str'"),
        ),
        (
            "message_delivery_timeout",
            5.5,
            TypeError,
            refused("5.5", DELIVERY, "TypeError: 'float' object cannot be cast as 'str'"),
        ),
        (
            "message_delivery_timeout",
            None,
            TypeError,
            refused("None", DELIVERY, "TypeError: 'NoneType' object cannot be cast as 'str'"),
        ),
        # an enum key takes its enum's members only
        (
            "default_encoding",
            "json",
            TypeError,
            refused("'json'", ENCODING, "'str' object cannot be cast as 'Encoding'"),
        ),
        (
            "default_encoding",
            1,
            TypeError,
            refused("1", ENCODING, "'int' object cannot be cast as 'Encoding'"),
        ),
        # bools are bools; ints are unsigned, some non-zero, one a byte
        (
            "enable_log_forwarding",
            1,
            TypeError,
            refused("1", FORWARDING, "TypeError: 'int' object cannot be cast as 'bool'"),
        ),
        (
            "enable_log_forwarding",
            "true",
            TypeError,
            refused("true", FORWARDING, "TypeError: 'str' object cannot be cast as 'bool'"),
        ),
        (
            "max_cast_fanout",
            "4",
            TypeError,
            refused("'4'", FANOUT, "TypeError: 'str' object cannot be interpreted as an integer"),
        ),
        (
            "max_cast_fanout",
            4.0,
            TypeError,
            refused("4.0", FANOUT, "TypeError: 'float' object cannot be interpreted as an integer"),
        ),
        (
            "max_cast_fanout",
            -1,
            TypeError,
            refused("-1", FANOUT, "OverflowError: can't convert negative int to unsigned"),
        ),
        ("max_cast_fanout", 0, ValueError, refused("0", FANOUT, "expected non-zero usize")),
        (
            "max_cast_fanout",
            2**64,
            TypeError,
            refused(str(2**64), FANOUT, "OverflowError: int too big to convert"),
        ),
        (
            "tail_log_lines",
            "x y",
            TypeError,
            refused("x y", TAIL, "TypeError: 'str' object cannot be interpreted as an integer"),
        ),
        (
            "message_ttl_default",
            256,
            TypeError,
            refused("256", TTL, "OverflowError: out of range integral type conversion attempted"),
        ),
        (
            "codec_max_frame_length",
            "64MiB",
            TypeError,
            refused("64MiB", FRAME, "TypeError: 'str' object cannot be interpreted as an integer"),
        ),
        ("rdma_max_nics_per_buffer", 0, ValueError, refused("0", NICS, "expected non-zero usize")),
        (
            "message_latency_sampling_rate",
            "0.5",
            TypeError,
            refused("0.5", RATE, "TypeError: must be real number, not str"),
        ),
        (
            "mesh_admin_addr",
            1729,
            TypeError,
            refused("1729", ADMIN, "TypeError: 'int' object cannot be cast as 'str'"),
        ),
        ("default_transport", 3, TypeError, "expected ChannelTransport enum, BindSpec, or str"),
        (
            "default_transport",
            "bogus",
            ValueError,
            "invalid str for BindSpec 'bogus': invalid bind spec: bogus",
        ),
        ("no_such_key", 1, ValueError, "invalid configuration key: `no_such_key`"),
    ],
)
def test_configure_refuses_as_upstream(
    key: str, value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        configure(**{key: value})
    assert type(info.value) is error
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("max_cast_fanout", True, 1),  # a bool is an int
        ("message_ttl_default", 0, 0),
        ("max_cast_dimension_size", 0, 0),
        ("message_latency_sampling_rate", 1, 1.0),
        ("message_latency_sampling_rate", 2.0, 2.0),  # no range
        ("message_latency_sampling_rate", 0.3, 0.30000001192092896),  # a 32-bit float
        ("rdma_max_nics_per_buffer", None, None),
        ("rdma_max_nics_per_buffer", 2, 2),
        ("default_encoding", Encoding.Json, Encoding.Json),
    ],
)
def test_configure_takes_as_upstream(key: str, value: object, shown: object) -> None:
    configure(**{key: value})
    assert get_global_config()[key] == shown


def bad_duration(text: str, why: str) -> str:
    return refused(repr(text), DELIVERY, f"ValueError: Invalid duration format '{text}': {why}")


UNITS = (
    "supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years "
    "(and few variations)"
)
TOO_LARGE = (
    "number is too large or cannot be represented without a lack of precision "
    "(values below 1ns are not supported)"
)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "value was empty"),
        ("  ", "value was empty"),
        ("5", "time unit needed, for example 5sec or 5ms"),
        ("1.5", "time unit needed, for example 1sec or 1ms"),
        ("1h 0", "time unit needed, for example 0sec or 0ms"),
        ("-5s", "expected number at 0"),
        ("5s x", "expected number at 3"),
        (".5s", "expected number at 0"),
        ("1h,5m", "invalid character at 2"),
        ("1.2.3s", "invalid character at 3"),
        ("1.", "invalid character at 1"),
        ("5 parsecs", f'unknown time unit "parsecs", {UNITS}'),
        ("5S", f'unknown time unit "S", {UNITS}'),
        ("5mo", f'unknown time unit "mo", {UNITS}'),
        ("1.5ns", TOO_LARGE),
        ("0.1M", TOO_LARGE),  # a fraction of a month must come to whole seconds
        ("0.333h", TOO_LARGE),
        ("18446744073709551616s", TOO_LARGE),
    ],
)
def test_bad_durations_are_refused_in_upstreams_words(text: str, why: str) -> None:
    with pytest.raises(TypeError) as info:
        configure(message_delivery_timeout=text)
    assert str(info.value) == bad_duration(text, why)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("0", "0s"),
        (" 5s ", "5s"),
        ("3 5s", "35s"),  # whitespace inside a number is skipped
        ("1h30m", "1h 30m"),
        ("1.5s", "1s 500ms"),
        ("0.1234m", "7s 404ms"),
        ("10.5h", "10h 30m"),
        ("5w", "1month 4days 13h 26m 24s"),
        ("5M", "5months"),
        ("2yrs", "2years"),
        ("5µs", "5us"),
        ("1s1ms1us1ns", "1s 1ms 1us 1ns"),
        ("300s", "5m"),
    ],
)
def test_durations_read_as_upstreams(text: str, shown: str) -> None:
    configure(message_delivery_timeout=text)
    assert get_global_config()["message_delivery_timeout"] == shown


# -- ChannelTransport ------------------------------------------------------------------------------

UPSTREAM_TRANSPORTS = {
    "TcpWithLocalhost": 0,
    "TcpWithHostname": 1,
    "MetaTlsWithHostname": 2,
    "MetaTlsWithIpV6": 3,
    "Tls": 4,
    "Quic": 5,
    "MetaQuicWithHostname": 6,
    "MetaQuicWithIpV6": 7,
    "Local": 8,
    "Unix": 9,
}


@pytest.mark.parametrize(("name", "number"), sorted(UPSTREAM_TRANSPORTS.items()))
def test_every_upstream_channel_transport(name: str, number: int) -> None:
    member = getattr(ChannelTransport, name)
    assert int(member) == number
    assert repr(member) == str(member) == f"ChannelTransport.{name}"
    assert member.get() == member
    assert member == getattr(ChannelTransport, name)
    assert member != (ChannelTransport.Local if name != "Local" else ChannelTransport.Unix)
    configure(default_transport=member)  # each is a transport configure takes


# -- default_transport: a BindSpec ----------------------------------------------------------------


def test_default_transport_is_a_bind_spec() -> None:
    value = get_global_config()["default_transport"]
    assert isinstance(value, BindSpec)
    assert type(value).__module__ == "monarch._rust_bindings.monarch_hyperactor.channel"
    assert (repr(value), str(value)) == ("PyBindSpec(Any(Unix))", "unix")
    assert value == get_global_config()["default_transport"] == BindSpec(ChannelTransport.Unix)
    assert value == BindSpec("unix") and value != BindSpec("tcp")
    assert value != "unix" and value != ChannelTransport.Unix  # equal only to a BindSpec
    with pytest.raises(TypeError, match="unhashable type"):
        hash(value)
    with pytest.raises(TypeError, match=r"cannot pickle '.*BindSpec' object"):
        pickle.dumps(value)
    configure(default_transport=value)  # what it shows, configure takes
    assert get_global_config()["default_transport"] == value


@pytest.mark.parametrize(
    ("given", "shown", "text"),
    [
        ("unix", "Any(Unix)", "unix"),
        ("tcp", "Any(Tcp(Hostname))", "tcp(Hostname)"),
        ("tcp(Hostname)", "Any(Tcp(Hostname))", "tcp(Hostname)"),
        ("tls", "Any(Tls)", "tls"),
        ("local", "Any(Local)", "local"),
        (ChannelTransport.TcpWithHostname, "Any(Tcp(Hostname))", "tcp(Hostname)"),
        (ChannelTransport.Tls, "Any(Tls)", "tls"),
        (ChannelTransport.Local, "Any(Local)", "local"),
        ("tcp://127.0.0.1:5555", "Addr(Tcp(127.0.0.1:5555))", "tcp:127.0.0.1:5555"),
        ("tcp:127.0.0.1:0", "Addr(Tcp(127.0.0.1:0))", "tcp:127.0.0.1:0"),
        ("tcp://[::1]:0", "Addr(Tcp([::1]:0))", "tcp:[::1]:0"),
        (
            "tls://example.org:443",
            'Addr(Tls(TlsAddr { hostname: "example.org", port: 443 }))',
            "tls:example.org:443",
        ),
        ("ipc://x", 'Addr(Unix(Bound("x" (pathname))))', "unix:x"),
        ("unix:@sock", 'Addr(Unix(Bound("sock" (abstract))))', "unix:@sock"),
    ],
)
def test_configured_transport_shows_as_upstreams(given: object, shown: str, text: str) -> None:
    configure(default_transport=given)
    value = get_global_config()["default_transport"]
    assert (repr(value), str(value)) == (f"PyBindSpec({shown})", text)
    assert value == BindSpec(given)


@pytest.mark.parametrize(
    "word", ["ipc", "metatls", "metatls-hostname", "Unix", " unix", "tcp://127.0.0.1", "local://1"]
)
def test_configure_refuses_what_upstreams_bind_spec_refuses(word: str) -> None:
    with pytest.raises(ValueError, match="invalid bind spec") as info:
        configure(default_transport=word)  # "ipc" is enable_transport's word, not configure's
    assert str(info.value) == f"invalid str for BindSpec '{word}': invalid bind spec: {word}"
    assert str(get_global_config()["default_transport"]) == "unix"
