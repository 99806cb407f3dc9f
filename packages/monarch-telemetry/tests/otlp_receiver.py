"""An OTLP/HTTP receiver over a real socket: what the exporters of every process send,
decoded with the opentelemetry-proto messages (no mock of the exporter)."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Received:
    """Spans, metric points and log records received so far (flattened)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.spans: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.logs: list[dict[str, Any]] = []

    def wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(condition, timeout)


def _attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def _scoped(resources: Any, scopes: str, items: str) -> Iterator[tuple[str | None, Any]]:
    """(service name, item) for the items of every scope of every resource of a request
    (spans of ``resource_spans``, metrics of ``resource_metrics``)."""
    for resource in resources:
        service = _attributes(resource.resource.attributes).get("service.name")
        for scope in getattr(resource, scopes):
            for item in getattr(scope, items):
                yield service, item


def _take_traces(received: Received, body: bytes) -> bytes:
    request = ExportTraceServiceRequest.FromString(body)
    with received.changed:
        for service, span in _scoped(request.resource_spans, "scope_spans", "spans"):
            received.spans.append(
                {
                    "name": span.name,
                    "service": service,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent": span.parent_span_id.hex(),
                    "kind": span.kind,
                    "status": span.status.code,
                    "attributes": _attributes(span.attributes),
                }
            )
        received.changed.notify_all()
    reply: bytes = ExportTraceServiceResponse().SerializeToString()
    return reply


def _take_metrics(received: Received, body: bytes) -> bytes:
    request = ExportMetricsServiceRequest.FromString(body)
    with received.changed:
        for service, metric in _scoped(request.resource_metrics, "scope_metrics", "metrics"):
            kind = metric.WhichOneof("data")
            for point in getattr(metric, kind).data_points:
                value: Any = None
                if kind in ("sum", "gauge"):
                    value = getattr(point, point.WhichOneof("value"))
                elif kind == "histogram":
                    value = point.count
                received.metrics.append(
                    {
                        "name": metric.name,
                        "service": service,
                        "value": value,
                        "attributes": _attributes(point.attributes),
                    }
                )
        received.changed.notify_all()
    reply: bytes = ExportMetricsServiceResponse().SerializeToString()
    return reply


def _take_logs(received: Received, body: bytes) -> bytes:
    request = ExportLogsServiceRequest.FromString(body)
    with received.changed:
        for service, record in _scoped(request.resource_logs, "scope_logs", "log_records"):
            received.logs.append(
                {
                    "body": record.body.string_value,
                    "service": service,
                    "severity": record.severity_text,
                    "trace_id": record.trace_id.hex(),
                    "span_id": record.span_id.hex(),
                    "attributes": _attributes(record.attributes),
                }
            )
        received.changed.notify_all()
    reply: bytes = ExportLogsServiceResponse().SerializeToString()
    return reply


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """``(endpoint URL, what it received)`` while the server runs."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                reply = _take_traces(received, body)
            elif self.path == "/v1/metrics":
                reply = _take_metrics(received, body)
            elif self.path == "/v1/logs":
                reply = _take_logs(received, body)
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
