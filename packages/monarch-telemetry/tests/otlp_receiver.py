"""An OTLP/HTTP receiver, a process of its own over a real socket: what the exporters of
every process send, decoded with the opentelemetry-proto messages (no mock of the
exporter) and written as JSON lines to a file.

``python otlp_receiver.py FILE`` prints its endpoint URL, then serves until it is
terminated; ``otlp_receiver(folder)`` runs it for a test and reads what it wrote.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

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

Item = dict[str, Any]


# -- the receiver process ---------------------------------------------------------------------


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


def _spans(body: bytes) -> list[Item]:
    request = ExportTraceServiceRequest.FromString(body)
    return [
        {
            "type": "span",
            "name": span.name,
            "service": service,
            "trace_id": span.trace_id.hex(),
            "span_id": span.span_id.hex(),
            "parent": span.parent_span_id.hex(),
            "kind": span.kind,
            "status": span.status.code,
            "attributes": _attributes(span.attributes),
        }
        for service, span in _scoped(request.resource_spans, "scope_spans", "spans")
    ]


def _metrics(body: bytes) -> list[Item]:
    request = ExportMetricsServiceRequest.FromString(body)
    out = []
    for service, metric in _scoped(request.resource_metrics, "scope_metrics", "metrics"):
        kind = metric.WhichOneof("data")
        for point in getattr(metric, kind).data_points:
            value: Any = None
            if kind in ("sum", "gauge"):
                value = getattr(point, point.WhichOneof("value"))
            elif kind == "histogram":
                value = point.count
            out.append(
                {
                    "type": "metric",
                    "name": metric.name,
                    "service": service,
                    "value": value,
                    "attributes": _attributes(point.attributes),
                }
            )
    return out


def _logs(body: bytes) -> list[Item]:
    request = ExportLogsServiceRequest.FromString(body)
    return [
        {
            "type": "log",
            "body": record.body.string_value,
            "service": service,
            "severity": record.severity_text,
            "trace_id": record.trace_id.hex(),
            "span_id": record.span_id.hex(),
            "attributes": _attributes(record.attributes),
        }
        for service, record in _scoped(request.resource_logs, "scope_logs", "log_records")
    ]


SERVICES: dict[str, tuple[Callable[[bytes], list[Item]], Callable[[], Any]]] = {
    "/v1/traces": (_spans, ExportTraceServiceResponse),
    "/v1/metrics": (_metrics, ExportMetricsServiceResponse),
    "/v1/logs": (_logs, ExportLogsServiceResponse),
}
"""Each path's decoder, and its (empty) success response."""


def serve(out: IO[str]) -> None:
    """Receive until terminated, each request's items written (whole lines) to ``out``."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            service = SERVICES.get(self.path)
            if service is None:
                self.send_response(404)
                self.end_headers()
                return
            decode, response = service
            lines = "".join(json.dumps(item) + "\n" for item in decode(body))
            with lock:
                out.write(lines)
                out.flush()
            reply: bytes = response().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


# -- the test's side ---------------------------------------------------------------------------


class Received:
    """What the receiver process has written so far (spans, metric points, log records)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _items(self, kind: str) -> list[Item]:
        text = self.path.read_text() if self.path.exists() else ""
        whole = text[: text.rfind("\n") + 1]  # not a line being written
        items = [json.loads(line) for line in whole.splitlines()]
        return [item for item in items if item["type"] == kind]

    @property
    def spans(self) -> list[Item]:
        return self._items("span")

    @property
    def metrics(self) -> list[Item]:
        return self._items("metric")

    @property
    def logs(self) -> list[Item]:
        return self._items("log")

    def wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Whether ``condition`` came true (checked as the file grows) within ``timeout``."""
        deadline = time.monotonic() + timeout
        seen = -1
        while True:
            size = self.path.stat().st_size if self.path.exists() else 0
            if size != seen:
                seen = size
                if condition():
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


@contextmanager
def otlp_receiver(folder: Path) -> Iterator[tuple[str, Received]]:
    """``(endpoint URL, what it received)`` while the receiver process runs."""
    path = folder / "received.jsonl"
    receiver = subprocess.Popen(
        [sys.executable, __file__, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert receiver.stdout is not None
        endpoint = receiver.stdout.readline().strip()
        if not endpoint.startswith("http://"):
            raise RuntimeError(f"the OTLP receiver did not start (exit {receiver.poll()})")
        yield endpoint, Received(path)
    finally:
        receiver.terminate()
        receiver.wait(10)


if __name__ == "__main__":
    with open(sys.argv[1], "a", encoding="utf-8") as file:
        serve(file)
