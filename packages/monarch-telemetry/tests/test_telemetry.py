"""Spans and metrics of real calls, exported over OTLP/HTTP by the client and its procs and
decoded by a receiver process; the trace context carried by a call (hypothesis); the names
``monarch.actor`` lends from this wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from otlp_receiver import otlp_receiver

from monarch.config import configure
from monarch.core import current_instrumentation, set_instrumentation

CLIENT = Path(__file__).with_name("telemetry_client.py")


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def test_a_call_is_one_trace_from_the_client_into_every_actor(tmp_path: Path) -> None:
    with otlp_receiver(tmp_path) as (endpoint, received):
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
        }
        done = subprocess.run(
            [sys.executable, str(CLIENT)], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.splitlines()[-1])
        assert result["values"] == [2, 2] and result["doubled"] == [8, 8]
        assert result["relayed"] == 105 and result["failed"]

        spans_wanted = {"Worker.work", "inner", "double-it", "Helper.work", "Worker.fail"}
        metrics_wanted = {
            "monarch.endpoint.calls",
            "monarch.endpoint.duration",
            "monarch.supervision.events",
            "user.things",
            "monarch.actor.queue_depth",
        }
        logs_wanted = {"stepping", "working on 1"}

        def arrived() -> bool:
            names = {s["name"] for s in received.spans}
            metrics = {m["name"] for m in received.metrics}
            logs = {r["body"] for r in received.logs}
            return spans_wanted <= names and metrics_wanted <= metrics and logs_wanted <= logs

        assert received.wait_for(arrived, 30), received.spans
        spans = received.spans

    step = result["step"]
    (client_step,) = by_name(spans, "client-step")
    assert client_step["service"] == "monarch-client" and client_step["trace_id"] == step
    sends = {s["span_id"]: s for s in spans if s["name"] == "send workers.work"}
    assert sends and all(s["parent"] == client_step["span_id"] for s in sends.values())
    work = by_name(spans, "Worker.work")
    assert sorted(s["attributes"]["monarch.rank"] for s in work) == [0, 1]
    for s in work:
        assert s["service"] == "monarch-proc" and s["trace_id"] == step
        assert s["parent"] in sends  # the endpoint continues the caller's trace
    inner = by_name(spans, "inner")
    assert {s["parent"] for s in inner} == {s["span_id"] for s in work}
    awork = by_name(spans, "AsyncWorker.work")
    assert len(awork) == 2 and all(s["trace_id"] == step for s in awork)
    assert {s["parent"] for s in by_name(spans, "double-it")} == {s["span_id"] for s in awork}

    # A call made inside an endpoint joins the trace of the call that ran it.
    (relay,) = by_name(spans, "Worker.relay")
    (helped,) = by_name(spans, "Helper.work")
    assert relay["trace_id"] == helped["trace_id"] == result["relay"]
    (failed,) = by_name(spans, "Worker.fail")
    assert failed["status"] == 2  # STATUS_CODE_ERROR

    metrics = received.metrics
    calls = [m for m in metrics if m["name"] == "monarch.endpoint.calls"]
    assert {m["attributes"]["monarch.endpoint"] for m in calls} >= {"Worker.work", "Worker.fail"}
    errors = [m for m in metrics if m["name"] == "monarch.endpoint.errors"]
    assert any(m["attributes"]["monarch.endpoint"] == "Worker.fail" for m in errors)
    sent = [m for m in metrics if m["name"] == "monarch.calls.sent"]
    assert any(m["service"] == "monarch-client" for m in sent)
    assert any(m["name"] == "user.things" and m["value"] == 3 for m in metrics)
    payload = [m for m in metrics if m["name"] == "monarch.endpoint.payload"]
    assert any(m["attributes"]["monarch.endpoint"] == "Worker.take" for m in payload)
    durations = [m for m in metrics if m["name"] == "monarch.endpoint.duration"]
    timed = {m["attributes"]["monarch.endpoint"] for m in durations if m["value"]}
    assert {"Worker.work", "Helper.work", "AsyncWorker.work"} <= timed
    assert {m["service"] for m in durations} == {"monarch-proc"}
    # The failed actor's supervision event, counted where it was reported: its owner.
    supervision = [m for m in metrics if m["name"] == "monarch.supervision.events"]
    # (cumulative: each export of the client may repeat the point)
    assert {(m["service"], m["attributes"]["monarch.mesh"], m["value"]) for m in supervision} == {
        ("monarch-client", "dying", 1)
    }
    depths = [m for m in metrics if m["name"] == "monarch.actor.queue_depth"]
    assert all(isinstance(m["value"], int) and m["value"] >= 0 for m in depths)
    assert {m["service"] for m in depths} == {"monarch-proc"}

    # Log records go out with the span current where they were logged: the client's step,
    # each Worker.work of the procs.
    (stepping,) = [r for r in received.logs if r["body"] == "stepping"]
    assert stepping["service"] == "monarch-client" and stepping["trace_id"] == step
    assert stepping["span_id"] == client_step["span_id"] and stepping["severity"] == "WARN"
    working = [r for r in received.logs if r["body"] == "working on 1"]
    assert {r["span_id"] for r in working} == {s["span_id"] for s in work}
    assert all(r["service"] == "monarch-proc" for r in working)
    # The runtime's own records go out too (the procs' start, from monarch.core).
    assert any("listening at" in r["body"] for r in received.logs)


def test_without_telemetry_the_names_say_which_wheel_when_missing() -> None:
    script = (
        "import importlib.metadata as m\n"
        "m.entry_points = lambda **kw: ()  # as if monarch-telemetry were not installed\n"
        "import monarch.actor\n"
        "try:\n    monarch.actor.span\nexcept ImportError as e:\n    print(e)\n"
        "from monarch.core import current_instrumentation\n"
        "print(current_instrumentation())"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "needs the monarch-telemetry wheel" in done.stdout
    assert done.stdout.strip().endswith("None")  # nothing instruments a plain client


# -- the trace context a call carries, in this process ----------------------------------------

_exporter = InMemorySpanExporter()


@pytest.fixture(scope="module")
def telemetry() -> Iterator[Any]:
    """This wheel's instrumentation, with spans kept in memory; this test process is left
    as it was (no instrumentation, telemetry off for procs spawned later)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_exporter))
    trace.set_tracer_provider(provider)
    before = current_instrumentation()
    from monarch.telemetry._instrumentation import OpenTelemetry

    yield OpenTelemetry()
    set_instrumentation(before)
    configure(enable_telemetry=False)


ids = st.integers(min_value=1, max_value=2**64 - 1)


class Class:
    """An actor's class, as the core names it to the hook (``Class.method``)."""


@given(trace_id=st.integers(1, 2**128 - 1), span_id=ids, rank=st.integers(0, 9999))
def test_an_endpoint_continues_the_trace_its_call_carried(
    telemetry: Any, trace_id: int, span_id: int, rank: int
) -> None:
    _exporter.clear()
    caller = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(caller)):
        carried = telemetry.outgoing("mesh", "method")
    scope = telemetry.enter(Class, "method", "actor", "mesh<1>", rank, carried, [], lambda: 0)
    assert trace.get_current_span() is scope.span  # current while the endpoint runs
    scope.close(None)
    assert trace.get_current_span() is not scope.span
    send, endpoint = _exporter.get_finished_spans()
    assert send.name == "send mesh.method" and endpoint.name == "Class.method"
    assert send.context.trace_id == endpoint.context.trace_id == trace_id
    assert send.parent is not None and send.parent.span_id == span_id
    assert endpoint.parent is not None and endpoint.parent.span_id == send.context.span_id
    assert endpoint.attributes is not None and endpoint.attributes["monarch.rank"] == rank


def test_importing_instruments_nothing_asking_monarch_actor_does() -> None:
    script = (
        "import monarch.telemetry\n"
        "from monarch.core import current_config, current_instrumentation\n"
        "print(current_instrumentation() is None, current_config().enable_telemetry)\n"
        "import monarch.actor\n"
        "assert monarch.actor.span is monarch.telemetry.span\n"
        "assert monarch.actor.get_meter is monarch.telemetry.get_meter\n"
        "print(current_instrumentation() is None, current_config().enable_telemetry)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["True False", "False True"]
