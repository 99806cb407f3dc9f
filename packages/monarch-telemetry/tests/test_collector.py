"""A job whose OTLP collector does not answer neither waits for it nor repeats itself."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from monarch.telemetry._collector import Collector, endpoint_address, guarded

PROBE = """
import monarch.telemetry
monarch.telemetry.install()
from monarch.actor import Actor, endpoint, this_host

class A(Actor):
    @endpoint
    def hi(self) -> int:
        return 1

procs = this_host().spawn_procs(per_host={"gpus": 2})
print(procs.spawn("a", A).hi.call().get(timeout=60).item(gpus=1))
"""


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port of this host where nothing listens (bound, never listened: refused)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def test_an_unreachable_collector_is_said_once_and_nothing_is_retried(
    closed_port: int, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{closed_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_METRIC_EXPORT_INTERVAL": "100",
    }
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1"]
    said = f"the OTLP collector at 127.0.0.1:{closed_port} is unreachable"
    assert done.stderr.count(said) == 1, done.stderr
    assert "Transient error" not in done.stderr
    assert "Failed to export" not in done.stderr


def test_a_guarded_exporter_drops_a_batch_at_once_while_the_collector_refuses(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = guarded(OTLPSpanExporter, SpanExportResult.FAILURE)(
        endpoint=f"http://127.0.0.1:{closed_port}/v1/traces"
    )
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        pass

    def told() -> int:
        return sum("is unreachable" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.DEBUG):
        assert exporter.export([span]) is SpanExportResult.FAILURE
        first = told()  # said once, unless an earlier test of this process said it
        for _ in range(2):
            assert exporter.export([span]) is SpanExportResult.FAILURE
    assert told() == first  # not said again
    assert not [r for r in caplog.records if "Transient error" in r.getMessage()]
    exporter.shutdown()


def test_a_listening_collector_is_reachable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert Collector(("127.0.0.1", port)).reachable()


def test_an_answering_collector_is_probed_again_only_after_a_failed_export() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        collector = Collector(("127.0.0.1", server.getsockname()[1]))
        assert collector.reachable()
    assert collector.reachable()  # gone, but no export failed: no probe per batch
    collector.failed()
    assert not collector.reachable()  # probed: refused


def test_a_refusing_collector_is_not_probed_again_at_once(closed_port: int) -> None:
    collector = Collector(("127.0.0.1", closed_port))
    assert not collector.reachable()
    with socket.create_server(("127.0.0.1", 0)) as server:
        # Even pointed at a listener now, it waits for the recheck before probing again.
        collector.address = ("127.0.0.1", server.getsockname()[1])
        assert not collector.reachable()


@given(
    scheme=st.sampled_from(["http", "https"]),
    host=st.sampled_from(["127.0.0.1", "collector", "otel.example.com", "[::1]"]),
    port=st.one_of(st.none(), st.integers(1, 65535)),
    path=st.sampled_from(["", "/", "/v1/traces", "/v1/metrics"]),
)
def test_an_endpoint_names_its_host_and_port(
    scheme: str, host: str, port: int | None, path: str
) -> None:
    url = f"{scheme}://{host}{'' if port is None else f':{port}'}{path}"
    default = 443 if scheme == "https" else 80
    assert endpoint_address(url) == (host.strip("[]"), default if port is None else port)
