"""``monarch.config``: key registry, layers, errors, durations, snapshot and pytest helpers."""

from __future__ import annotations

import datetime
import enum
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import monarch
import monarch.config
from monarch.config import (
    Encoding,
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    parametrize_config,
    parametrize_config_pointwise,
)
from monarch.core import _config
from monarch.core._config import (
    CONFIG_FILE_ENV,
    KEYS,
    BindSpec,
    _key,
    _units,
    config_version,
    current_config,
    format_duration,
    parse_byte_size,
    parse_duration,
    refresh_environment,
    reload_from_environment,
    runtime_env,
)

ALL_ENV_VARS = sorted({var for key in KEYS.values() for var in key.env} | {CONFIG_FILE_ENV})
HYPOTHESIS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Each test starts from defaults only: no config env vars, no file, empty runtime layer."""
    for var in ALL_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    reload_from_environment()
    clear_runtime_config()
    yield monkeypatch
    monkeypatch.undo()
    reload_from_environment()
    clear_runtime_config()


# --- registry and defaults -------------------------------------------------------------------


def test_public_module_is_a_thin_reexport() -> None:
    assert set(monarch.config.__all__) == {
        "Encoding",
        "clear_runtime_config",
        "configure",
        "configured",
        "get_global_config",
        "get_runtime_config",
        "parametrize_config",
        "parametrize_config_pointwise",
    }
    assert monarch.config.configure is _config.configure
    assert monarch.configure is configure  # upstream's top-level alias


def test_defaults_match_upstream() -> None:
    config = get_global_config()
    assert list(config) == list(KEYS)
    assert str(config["default_transport"]) == "unix"  # a BindSpec, as upstream's
    assert config["codec_max_frame_length"] == 10 * 1024**3
    assert config["default_encoding"] is Encoding.Multipart
    assert config["message_delivery_timeout"] == "30s"
    assert config["message_ack_time_interval"] == "500ms"
    assert config["supervision_watchdog_timeout"] == "2m"
    assert config["cleanup_timeout"] == "3s"
    assert config["mesh_terminate_concurrency"] == 16
    assert config["max_cast_fanout"] == 16
    assert config["enable_dest_actor_reordering_buffer"] is True
    assert config["prefix_with_rank"] is True
    assert config["mesh_admin_addr"] == "[::]:1729"
    assert config["rdma_max_chunk_size_mb"] == 64
    assert config["rdma_min_stripe_size_kb"] == 512
    assert config["heartbeat_interval"] == "1s"
    assert config["heartbeat_timeout"] == "5s"
    assert get_runtime_config() == {}


def test_every_key_has_an_env_var_and_doc() -> None:
    for key in KEYS.values():
        assert key.env and key.doc, key.name
        assert key.default_value == get_global_config()[key.name]
    ours = {k.name for k in KEYS.values() if k.ours}
    assert ours == {
        "enable_telemetry",
        "event_loop",
        "fork_procs",
        "loop_follows_waiter",
        "prestart_zygote",
        "proc_preload",
        "rdma_tcp_integrity",
        "heartbeat_interval",
        "heartbeat_timeout",
        "procs_per_process",
        "prefix_python_logs_with_actor",
        "read_peer_buffers",
        "sync_actor_threads",
        "telemetry_sink",
        "transport_handshake_timeout",
        "wait_spin",
    }
    assert KEYS["default_transport"].env[:2] == (
        "HYPERACTOR_MESH_DEFAULT_TRANSPORT",
        "HYPERACTOR_DEFAULT_TRANSPORT",
    )


# --- configure and its errors ----------------------------------------------------------------


def test_configure_writes_the_runtime_layer() -> None:
    configure(enable_log_forwarding=True, tail_log_lines=100, message_delivery_timeout="1m")
    assert get_runtime_config() == {
        "enable_log_forwarding": True,
        "tail_log_lines": 100,
        "message_delivery_timeout": "1m",
    }
    assert get_global_config()["tail_log_lines"] == 100
    configure(tail_log_lines=5)  # additive
    assert get_runtime_config()["enable_log_forwarding"] is True
    clear_runtime_config()
    assert get_runtime_config() == {}
    assert get_global_config()["tail_log_lines"] == 0


def test_unknown_key_is_a_value_error_and_nothing_changes() -> None:
    with pytest.raises(ValueError, match="invalid configuration key: `no_such_key`"):
        configure(tail_log_lines=3, no_such_key=1)
    assert get_runtime_config() == {}


# Upstream's keys refuse wrong types with upstream's errors (test_dropin_config.py); the keys of
# our own read values leniently and name the key and what it takes.
@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("procs_per_process", "5", "an int"),
        ("procs_per_process", 0, "an int >= 1"),
        ("read_peer_buffers", 1, "a bool"),
        ("heartbeat_timeout", "thirty seconds", "a duration"),
        ("heartbeat_timeout", "30", None),  # plain seconds are fine
        ("heartbeat_timeout", 30, None),
        ("heartbeat_timeout", "-5s", "a duration"),
        ("heartbeat_timeout", float("inf"), "a duration"),
        ("heartbeat_timeout", True, "a duration"),
        ("heartbeat_timeout", None, "a duration"),
    ],
)
def test_wrong_type_for_our_keys_is_a_type_error_naming_key_and_type(
    key: str, value: object, expected: str | None
) -> None:
    if expected is None:
        configure(**{key: value})
        return
    with pytest.raises(TypeError) as excinfo:
        configure(**{key: value})
    assert repr(key) in str(excinfo.value)
    assert expected in str(excinfo.value)
    assert get_runtime_config() == {}


def test_transport_errors() -> None:
    with pytest.raises(ValueError, match="invalid str for BindSpec 'carrier-pigeon'"):
        configure(default_transport="carrier-pigeon")
    with pytest.raises(TypeError, match="expected ChannelTransport enum, BindSpec, or str"):
        configure(default_transport=3)
    assert get_runtime_config() == {}


# --- value types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h 30m", 5400.0),
        ("1h30m", 5400.0),
        ("10us", 1e-5),
        ("10µs", 1e-5),
        ("7ns", 7e-9),
        ("1day 2h", 93600.0),
        ("2 weeks", 1209600.0),
        ("1M", 2630016.0),  # humantime month; "m" is a minute
        ("1y", 31557600.0),
        ("1.5s", 1.5),
        ("30", 30.0),
        (" 0.25 ", 0.25),
        ("0s", 0.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_duration_accepts_numbers_and_timedelta() -> None:
    """In the environment, the file and our own keys; upstream's ``configure`` takes strings."""
    assert parse_duration(30) == 30.0
    assert parse_duration(0.1) == 0.1
    assert parse_duration(datetime.timedelta(minutes=1, microseconds=5)) == 60.000005
    configure(heartbeat_timeout=datetime.timedelta(seconds=90))
    assert get_global_config()["heartbeat_timeout"] == "1m 30s"
    configure(heartbeat_timeout=0.5)
    assert current_config().heartbeat_timeout == 0.5


@pytest.mark.parametrize("text", ["", "  ", "s", "5 5s", "5s x", "1.2.3s", "-1s", "5 bananas"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration|time unit"):
        parse_duration(text)


def test_durations_read_back_normalised_like_humantime() -> None:
    configure(host_spawn_ready_timeout="300s", message_delivery_timeout="90s")
    config = get_global_config()
    assert config["host_spawn_ready_timeout"] == "5m"
    assert config["message_delivery_timeout"] == "1m 30s"
    assert format_duration(0) == "0s"
    assert format_duration(86400 * 2 + 0.001) == "2days 1ms"
    assert format_duration(1.000000001) == "1s 1ns"


def test_byte_sizes() -> None:
    assert parse_byte_size("10GiB") == 10 * 1024**3
    assert parse_byte_size("1GB") == 10**9
    assert parse_byte_size("64 MiB") == 64 * 1024**2
    assert parse_byte_size("1.5KiB") == 1536
    assert parse_byte_size("4096") == 4096
    assert KEYS["codec_max_frame_length"].parse_text("64MiB") == 64 * 1024**2  # environment
    with pytest.raises(ValueError, match="invalid byte size"):
        parse_byte_size("10 parsecs")


class ChannelTransport(enum.Enum):
    """Stands in for upstream's ChannelTransport enum."""

    Unix = 0
    TcpWithHostname = 1
    TcpWithLocalhost = 2
    Tls = 3
    MetaTlsWithHostname = 4
    CarrierPigeon = 5


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        ("unix", "unix"),
        ("tcp", "tcp"),
        ("tls", "tls"),
        ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"),
        ("unix:///tmp/sock", "unix:///tmp/sock"),
        ("ipc://x", "unix://x"),
        ("tcp(Localhost)", "tcp://127.0.0.1:0"),
        ("ibverbs", "ibverbs"),  # monarch-rdma's transport (ours)
        ("ibverbs://10.0.0.5:0", "ibverbs://10.0.0.5:0"),
        (ChannelTransport.Unix, "unix"),
        (ChannelTransport.TcpWithHostname, "tcp"),
        (ChannelTransport.TcpWithLocalhost, "tcp://127.0.0.1:0"),
        (ChannelTransport.Tls, "tls"),
        (ChannelTransport.MetaTlsWithHostname, "tls"),
    ],
)
def test_default_transport(value: object, canonical: str) -> None:
    configure(default_transport=value)
    assert get_global_config()["default_transport"] == BindSpec(value)
    assert current_config().default_transport == canonical


@pytest.mark.parametrize("value", ["ipc", "TCP", "metatls-hostname", "ChannelTransport.Unix"])
def test_configure_refuses_transport_words_upstreams_bind_spec_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="invalid bind spec"):
        configure(default_transport=value)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("ipc", "unix"), ("TCP", "tcp"), ("metatls-hostname", "tls"), ("tcp(Hostname)", "tcp")],
)
def test_the_environment_reads_transports_leniently(text: str, canonical: str) -> None:
    assert KEYS["default_transport"].parse_text(text) == canonical


def test_unsupported_transport_enum_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="default_transport"):
        configure(default_transport=ChannelTransport.CarrierPigeon)


def test_encoding() -> None:
    assert [e.name for e in Encoding] == ["Bincode", "Json", "Multipart"]
    configure(default_encoding=Encoding.Bincode)
    assert get_global_config()["default_encoding"] is Encoding.Bincode
    assert repr(Encoding.Bincode) == "Encoding.Bincode"
    assert KEYS["default_encoding"].parse_text("serde_json") is Encoding.Json  # environment


# --- layers: defaults < env < file < runtime -------------------------------------------------


def test_env_layer(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("HYPERACTOR_MESH_TAIL_LOG_LINES", "5")
    fresh.setenv("HYPERACTOR_MESH_ENABLE_LOG_FORWARDING", "true")
    fresh.setenv("HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT", "5m")
    fresh.setenv("HYPERACTOR_CODEC_MAX_FRAME_LENGTH", "107374182400")
    fresh.setenv("HYPERACTOR_DEFAULT_ENCODING", "bincode")
    fresh.setenv("MONARCH_RDMA_DISABLE_IBVERBS", "1")
    assert get_global_config()["tail_log_lines"] == 0  # read at (re)load only
    reload_from_environment()
    config = get_global_config()
    assert config["tail_log_lines"] == 5
    assert config["enable_log_forwarding"] is True
    assert config["message_delivery_timeout"] == "5m"
    assert config["codec_max_frame_length"] == 100 * 1024**3
    assert config["default_encoding"] is Encoding.Bincode
    assert config["rdma_disable_ibverbs"] is True
    assert get_runtime_config() == {}
    configure(tail_log_lines=9)  # runtime beats env
    assert get_global_config()["tail_log_lines"] == 9
    clear_runtime_config()
    assert get_global_config()["tail_log_lines"] == 5


def test_env_aliases(fresh: pytest.MonkeyPatch) -> None:
    fresh.setenv("HYPERACTOR_DEFAULT_TRANSPORT", "tcp")
    fresh.setenv("HYPERACTOR_ENABLE_LOG_FORWARDING", "yes")  # the non-MESH spelling also works
    reload_from_environment()
    assert current_config().default_transport == "tcp"
    assert get_global_config()["enable_log_forwarding"] is True
    fresh.setenv("HYPERACTOR_MESH_DEFAULT_TRANSPORT", "tls")  # listed first: wins
    reload_from_environment()
    assert current_config().default_transport == "tls"


def test_invalid_env_value_is_ignored_with_a_warning(
    fresh: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fresh.setenv("HYPERACTOR_MESH_TAIL_LOG_LINES", "many")
    fresh.setenv("HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT", "soon")
    fresh.setenv("HYPERACTOR_MESH_DEFAULT_TRANSPORT", "pigeon")  # bad first alias ...
    fresh.setenv("HYPERACTOR_DEFAULT_TRANSPORT", "tcp")  # ... falls through to the next
    with caplog.at_level(logging.WARNING, logger="monarch.config"):
        reload_from_environment()
    config = get_global_config()
    assert config["tail_log_lines"] == 0
    assert config["message_delivery_timeout"] == "30s"
    assert current_config().default_transport == "tcp"
    for var in (
        "HYPERACTOR_MESH_TAIL_LOG_LINES",
        "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
        "HYPERACTOR_MESH_DEFAULT_TRANSPORT",
    ):
        assert var in caplog.text


def test_import_survives_invalid_env() -> None:
    env = {"HYPERACTOR_MESH_TAIL_LOG_LINES": "many", CONFIG_FILE_ENV: "/nonexistent/monarch.toml"}
    code = "import monarch.config as c; print(c.get_global_config()['tail_log_lines'])"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**_subprocess_env(), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == "0\n"
    assert "HYPERACTOR_MESH_TAIL_LOG_LINES" in done.stderr
    assert "/nonexistent/monarch.toml" in done.stderr


def _subprocess_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ALL_ENV_VARS}


def test_file_layer(fresh: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "monarch.toml"
    path.write_text(
        'tail_log_lines = 7\nmessage_delivery_timeout = "2m"\nhost_spawn_ready_timeout = 90\n'
        'default_encoding = "json"\ncodec_max_frame_length = "1GiB"\nenable_file_capture = true\n'
        'prefix_with_rank = "false"\n'
    )
    fresh.setenv("HYPERACTOR_MESH_TAIL_LOG_LINES", "5")
    fresh.setenv("HYPERACTOR_MESH_ENABLE_LOG_FORWARDING", "true")
    fresh.setenv(CONFIG_FILE_ENV, str(path))
    reload_from_environment()
    config = get_global_config()
    assert config["tail_log_lines"] == 7  # file beats env
    assert config["enable_log_forwarding"] is True  # env still applies where the file is silent
    assert config["message_delivery_timeout"] == "2m"
    assert config["host_spawn_ready_timeout"] == "1m 30s"
    assert config["default_encoding"] is Encoding.Json
    assert config["codec_max_frame_length"] == 1024**3
    assert config["enable_file_capture"] is True
    assert config["prefix_with_rank"] is False
    with configured(tail_log_lines=9) as merged:  # runtime beats file
        assert merged["tail_log_lines"] == 9
    assert get_global_config()["tail_log_lines"] == 7


def test_bad_file_contents_are_warnings(
    fresh: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "monarch.toml"
    path.write_text('tail_log_lines = "lots"\nno_such_key = 1\nmax_cast_fanout = 4\n')
    fresh.setenv(CONFIG_FILE_ENV, str(path))
    with caplog.at_level(logging.WARNING, logger="monarch.config"):
        reload_from_environment()
    assert "tail_log_lines" in caplog.text and "no_such_key" in caplog.text
    assert get_global_config()["max_cast_fanout"] == 4
    assert get_global_config()["tail_log_lines"] == 0
    caplog.clear()
    path.write_text("this is [not toml")
    with caplog.at_level(logging.WARNING, logger="monarch.config"):
        reload_from_environment()
    assert str(path) in caplog.text
    assert get_global_config()["max_cast_fanout"] == 16


def test_runtime_env_reproduces_the_runtime_layer_in_a_child() -> None:
    configure(
        message_delivery_timeout="1h 2m 3.5s",
        default_encoding=Encoding.Json,
        default_transport="tcp://127.0.0.1:0",
        message_latency_sampling_rate=0.3,
        rdma_ibverbs_target="nic:mlx5_0",
        enable_log_forwarding=True,
    )
    expected = get_global_config()
    env = runtime_env()
    assert env["HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT"] == "1h 2m 3s 500ms"
    clear_runtime_config()
    reload_from_environment(env)
    assert get_global_config() == expected


# --- current_config snapshot -----------------------------------------------------------------


def test_current_config_is_cached_until_a_change() -> None:
    first = current_config()
    assert current_config() is first
    assert first.message_delivery_timeout == 30.0
    assert first.message_ack_time_interval == 0.5
    version = config_version()
    configure(message_delivery_timeout="45s")
    assert config_version() > version
    second = current_config()
    assert second is not first and second.message_delivery_timeout == 45.0
    assert first.message_delivery_timeout == 30.0  # old snapshots never change
    with pytest.raises(AttributeError):
        second.message_delivery_timeout = 1.0  # type: ignore[misc]
    clear_runtime_config()
    assert current_config().message_delivery_timeout == 30.0


def test_configure_from_many_threads() -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def writer(i: int) -> None:
        try:
            barrier.wait()
            for n in range(200):
                configure(tail_log_lines=i * 1000 + n, read_log_buffer=i)
                snapshot = current_config()
                assert snapshot.tail_log_lines >= 0
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    runtime = get_runtime_config()
    assert runtime["tail_log_lines"] % 1000 == 199
    assert current_config().tail_log_lines == runtime["tail_log_lines"]


# --- configured ------------------------------------------------------------------------------


def test_configured_restores_the_previous_runtime_layer() -> None:
    configure(tail_log_lines=1)
    with configured(tail_log_lines=2, enable_log_forwarding=True) as config:
        assert config["tail_log_lines"] == 2 and config["enable_log_forwarding"] is True
        with configured(default_transport="tcp") as inner:
            assert inner["tail_log_lines"] == 2 and inner["default_transport"] == BindSpec("tcp")
        assert get_global_config()["default_transport"] == BindSpec("unix")
        configure(max_cast_fanout=4)  # changes inside the block are undone too
    assert get_runtime_config() == {"tail_log_lines": 1}


def test_configured_restores_on_exception_and_on_bad_overrides() -> None:
    configure(tail_log_lines=1)
    with pytest.raises(RuntimeError), configured(tail_log_lines=2):
        raise RuntimeError("boom")
    assert get_runtime_config() == {"tail_log_lines": 1}
    with pytest.raises(TypeError), configured(tail_log_lines="two"):
        pass
    assert get_runtime_config() == {"tail_log_lines": 1}


# --- pytest helpers --------------------------------------------------------------------------


@parametrize_config(enable_log_forwarding={True, False}, tail_log_lines={0, 10})
def test_parametrize_config_cross_product(request: pytest.FixtureRequest) -> None:
    config = get_global_config()
    assert get_runtime_config().keys() == {"enable_log_forwarding", "tail_log_lines"}
    assert f"tail_log_lines={config['tail_log_lines']}" in request.node.name


@pytest.mark.anyio
@parametrize_config(message_delivery_timeout={"1s", "2m"})
async def test_parametrize_config_async() -> None:
    assert current_config().message_delivery_timeout in {1.0, 120.0}


@parametrize_config_pointwise(
    rdma_disable_ibverbs=[True, False], rdma_allow_tcp_fallback=[True, False]
)
def test_parametrize_config_pointwise_zips() -> None:
    config = get_global_config()
    assert config["rdma_disable_ibverbs"] == config["rdma_allow_tcp_fallback"]


@parametrize_config(tail_log_lines={3})
@parametrize_config(max_cast_fanout={4})
def test_parametrize_config_stacks() -> None:
    assert get_runtime_config() == {"tail_log_lines": 3, "max_cast_fanout": 4}


class TestParametrizeOnMethods:
    @parametrize_config(read_log_buffer={7})
    def test_method(self) -> None:
        assert isinstance(self, TestParametrizeOnMethods)
        assert get_global_config()["read_log_buffer"] == 7


def test_parametrize_config_builds_marks() -> None:
    def body(x: int) -> int:
        return int(get_global_config()["tail_log_lines"]) + x

    wrapped: Any = parametrize_config(tail_log_lines={2, 1})(body)
    (mark,) = wrapped.pytestmark
    assert mark.name == "parametrize"
    assert mark.args == ("_config_overrides", [{"tail_log_lines": 1}, {"tail_log_lines": 2}])
    assert mark.kwargs["ids"] == ["tail_log_lines=1", "tail_log_lines=2"]
    assert list(wrapped.__signature__.parameters) == ["x", "_config_overrides"]
    assert wrapped(x=1, _config_overrides={"tail_log_lines": 5}) == 6
    assert get_runtime_config() == {}

    pointwise: Any = parametrize_config_pointwise(tail_log_lines=[1, 2], max_cast_fanout=[3, 4])(
        body
    )
    assert pointwise.pytestmark[0].args[1] == [
        {"tail_log_lines": 1, "max_cast_fanout": 3},
        {"tail_log_lines": 2, "max_cast_fanout": 4},
    ]


def test_parametrize_config_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least one"):
        parametrize_config()
    with pytest.raises(ValueError, match="invalid configuration key"):
        parametrize_config(bogus={1})
    with pytest.raises(TypeError, match="mesh_tail_log_lines"):
        parametrize_config(tail_log_lines={"x"})
    with pytest.raises(ValueError, match="equally long"):
        parametrize_config_pointwise(tail_log_lines=[1, 2], max_cast_fanout=[3])


# --- properties ------------------------------------------------------------------------------

NS_RANGE = st.integers(min_value=0, max_value=2**52)  # a float resolves 1 ns up to ~52 days


def _values_for(name: str) -> st.SearchStrategy[object]:
    """Valid ``configure`` values for a key, in every accepted spelling (upstream's keys take
    fewer: no byte-size strings, durations only as strings, Encoding members only)."""
    key = KEYS[name]
    info = msgspec.inspect.type_info(key.type)
    optional = isinstance(info, msgspec.inspect.UnionType)
    if isinstance(info, msgspec.inspect.UnionType):
        info = next(t for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
    values = _present_values(key, info)
    return st.none() | values if optional else values


def _present_values(key: _key.Key, info: msgspec.inspect.Type) -> st.SearchStrategy[object]:
    if isinstance(info, msgspec.inspect.BoolType):
        return st.booleans()
    if key.spelling is _key.BYTE_SIZE and not key.upstream:
        assert isinstance(info, msgspec.inspect.IntType) and info.ge is not None
        return st.integers(info.ge, 2**50) | st.integers(max(info.ge, 1), 4096).map(
            lambda n: f"{n}KiB"
        )
    if key.spelling is _key.DURATION:
        if key.upstream:
            return NS_RANGE.map(_units.format_duration_ns)
        return NS_RANGE.flatmap(
            lambda ns: st.sampled_from(
                [
                    _units.format_duration_ns(ns),
                    ns / 1e9,
                    datetime.timedelta(microseconds=ns // 1000),
                ]
            )
        )
    if key.spelling is _key.ENCODING:
        return st.sampled_from(list(Encoding))
    if key.spelling is _key.TRANSPORT:
        return st.sampled_from(["unix", "ipc://x", "tcp", "tls", "local", "tcp://10.0.0.1:7"])
    if key.spelling is _key.EVENT_LOOP:
        return st.sampled_from([*_key.EVENT_LOOPS, "UVLoop", " asyncio"])
    if isinstance(info, msgspec.inspect.IntType):
        assert info.ge is not None
        return st.integers(info.ge, info.le if info.le is not None else 2**40)
    if isinstance(info, msgspec.inspect.FloatType):
        return st.floats(-1e12, 1e12)
    if isinstance(info, msgspec.inspect.StrType):
        return st.text()
    raise AssertionError(f"no strategy for {key.name}")


KEY_VALUES = st.sampled_from(list(KEYS)).flatmap(lambda k: st.tuples(st.just(k), _values_for(k)))


@HYPOTHESIS
@given(KEY_VALUES)
def test_any_valid_value_round_trips(key_value: tuple[str, object]) -> None:
    name, value = key_value
    key = KEYS[name]
    clear_runtime_config()
    configure(**{name: value})
    shown = get_global_config()[name]
    assert get_runtime_config() == {name: shown}
    assert key.coerce(shown) == key.coerce(value)  # same value, possibly normalised
    assert getattr(current_config(), name) == key.snapshot(key.coerce(value))
    configure(**{name: shown})  # the shown form is a fixpoint
    assert get_global_config()[name] == shown
    assert key.parse_text(key.text(key.coerce(value))) == key.coerce(value)  # env form
    clear_runtime_config()


CONFIG_CHANGES = st.lists(KEY_VALUES, max_size=3).map(dict)


@HYPOTHESIS
@given(base=CONFIG_CHANGES, stack=st.lists(st.tuples(CONFIG_CHANGES, st.booleans()), max_size=4))
def test_configured_always_restores(
    base: dict[str, object], stack: list[tuple[dict[str, object], bool]]
) -> None:
    class Boom(Exception):
        pass

    def enter(level: int) -> None:
        if level == len(stack):
            return
        overrides, explode = stack[level]
        before = get_runtime_config()
        try:
            with configured(**overrides) as merged:
                for name in overrides:
                    assert merged[name] == get_global_config()[name]
                enter(level + 1)
                if explode:
                    raise Boom
        except Boom:
            pass
        assert get_runtime_config() == before

    clear_runtime_config()
    configure(**base)
    start = get_runtime_config()
    enter(0)
    assert get_runtime_config() == start
    clear_runtime_config()


@HYPOTHESIS
@given(CONFIG_CHANGES)
def test_runtime_env_round_trips_any_runtime_layer(changes: dict[str, object]) -> None:
    """What a child reads from ``runtime_env()`` is what its parent configured."""
    clear_runtime_config()
    configure(**changes)
    expected = get_global_config()
    env = runtime_env()
    assert set(env) == {KEYS[name].env[0] for name in changes}
    clear_runtime_config()
    try:
        reload_from_environment(env)
        assert get_global_config() == expected
    finally:
        reload_from_environment()


@given(NS_RANGE)
def test_humantime_parse_format_round_trips(ns: int) -> None:
    seconds = ns / 1e9
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(min_value=0, max_value=10**30))
def test_humantime_round_trips_exactly_in_nanoseconds(ns: int) -> None:
    text = _units.format_duration_ns(ns)
    assert _units.parse_duration_ns(text) == ns


@given(
    st.lists(
        st.tuples(
            st.integers(0, 10**6), st.sampled_from(["ns", "us", "ms", "s", "m", "h", "d", "w", "y"])
        ),
        min_size=1,
        max_size=4,
    )
)
def test_humantime_format_normalises(terms: list[tuple[int, str]]) -> None:
    text = " ".join(f"{n}{unit}" for n, unit in terms)
    seconds = parse_duration(text)
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=1e-9)
    assert format_duration(parse_duration(format_duration(seconds))) == format_duration(seconds)


def test_the_handshake_deadline_of_the_jobs_connections_is_a_key() -> None:
    """Every listener and dial of the runtime takes its handshake deadline from
    ``transport_handshake_timeout`` (a machine starting a thousand procs may need more)."""
    from monarch.core._runtime._peers import peer_options

    assert peer_options("tcp://127.0.0.1:0", server=True)["handshake_timeout"] == 10.0
    with configured(transport_handshake_timeout="45s"):
        for server in (True, False):
            assert peer_options("tcp://127.0.0.1:0", server=server)["handshake_timeout"] == 45.0
    code = (
        "from monarch.core._runtime._peers import peer_options as p; "
        "print(p('unix://@x', server=False))"
    )
    env = {"MONARCH_TRANSPORT_HANDSHAKE_TIMEOUT": "90"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    assert "'handshake_timeout': 90.0" in done.stdout


ENV_TEXTS = st.one_of(
    st.sampled_from(["0", "1", "5", "true", "no", "30s", "2m", "tcp", "unix", "bincode", "many"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8),
)
ENV_CHANGES = st.lists(
    st.tuples(
        st.sampled_from([v for v in ALL_ENV_VARS if v != CONFIG_FILE_ENV] + ["MONARCH_TEST_OTHER"]),
        st.none() | ENV_TEXTS,
    ),
    max_size=6,
)


@HYPOTHESIS
@given(before=ENV_CHANGES, after=ENV_CHANGES)
def test_refreshing_what_changed_is_reloading_everything(
    fresh: pytest.MonkeyPatch,
    before: list[tuple[str, str | None]],
    after: list[tuple[str, str | None]],
) -> None:
    """A zygote's fork re-reads only the variables its request changed
    (``refresh_environment``): whatever the layers were read from and whatever changed
    since (aliases, bad values, removals, unrelated variables), the configuration is the
    one a full re-read gives."""

    def apply(changes: list[tuple[str, str | None]]) -> list[str]:
        for var, text in changes:
            if text is None:
                fresh.delenv(var, raising=False)
            else:
                fresh.setenv(var, text)
        return [var for var, _ in changes]

    apply(before)
    reload_from_environment()
    refreshed_from = config_version()
    changed = apply(after)
    refresh_environment(changed)
    refreshed = get_global_config()
    if not any(var in ALL_ENV_VARS for var in changed):
        assert config_version() == refreshed_from  # nothing to re-read: the snapshot stays
    reload_from_environment()
    assert refreshed == get_global_config()
    for var, _ in before + after:
        fresh.delenv(var, raising=False)


def test_refreshing_rereads_a_configured_file(fresh: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The file layer is read again at a refresh where one is configured (its contents may
    have changed since the zygote read it), and dropped where it no longer is."""
    path = tmp_path / "monarch.toml"
    path.write_text("tail_log_lines = 3\n")
    fresh.setenv(CONFIG_FILE_ENV, str(path))
    reload_from_environment()
    assert get_global_config()["tail_log_lines"] == 3
    path.write_text("tail_log_lines = 4\n")
    refresh_environment([])
    assert get_global_config()["tail_log_lines"] == 4
    fresh.delenv(CONFIG_FILE_ENV)
    refresh_environment([CONFIG_FILE_ENV])
    assert get_global_config()["tail_log_lines"] == 0
