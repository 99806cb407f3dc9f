"""OTLP export, where the environment asks for it and the SDK is installed.

Each process (the client, every proc) sets up its own providers: spans, metrics and log
records leave from where they happen, as OpenTelemetry's exporters expect. Log records are
every record of Python's ``logging`` that a logger lets through (the user's, in actors too,
and the runtime's), each with the trace and span current where it was logged. Nothing is
set up when the application has installed providers of its own; ``OTEL_LOGS_EXPORTER=none``
leaves logs out.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable
from typing import Any, Final

from opentelemetry import metrics, trace

from . import _collector
from ._collector import guarded, quiet_after_first

_providers: list[Any] = []
_factories: list[Callable[..., logging.LogRecord]] = []
_OWN_LOGGERS: Final = ("opentelemetry", "urllib3", "requests")
"""What the exporter logs is not exported (a failing export would feed itself)."""


def wanted() -> bool:
    return any(
        os.environ.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        )
    )


def _export_logs(resource: Any) -> None:
    """Log records over OTLP too (the SDK's logs API is still named ``_logs``)."""
    if os.environ.get("OTEL_LOGS_EXPORTER", "otlp").strip().lower() == "none":
        return
    try:
        from opentelemetry._logs import set_logger_provider
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs import export as log_export
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    except ImportError:
        return
    result = getattr(log_export, "LogRecordExportResult", None) or log_export.LogExportResult
    provider = LoggerProvider(resource=resource)
    exporter = guarded(OTLPLogExporter, result.FAILURE)()
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    set_logger_provider(provider)
    handler = LoggingHandler(level=logging.NOTSET, logger_provider=provider)
    made = logging.getLogRecordFactory()

    def exported(*args: Any, **kwargs: Any) -> logging.LogRecord:
        # Taken as made, not through a handler on the root logger: one there would turn
        # off Python's last resort and make the user's logging.basicConfig() do nothing.
        record = made(*args, **kwargs)
        if _providers and not record.name.startswith(_OWN_LOGGERS):
            handler.handle(record)
        return record

    logging.setLogRecordFactory(exported)
    _factories.append(made)
    _providers.append(provider)


def configure_export(service: str) -> bool:
    """Export spans and metrics over OTLP/HTTP as ``service``; False if not asked for, the
    SDK is missing, or providers are set already."""
    if _providers or not wanted():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            MetricExportResult,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
    except ImportError:
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application configured OpenTelemetry itself
    _collector.told_at = logging.WARNING if service == "monarch-client" else logging.INFO
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    tracer_provider = TracerProvider(resource=resource)
    spans = guarded(OTLPSpanExporter, SpanExportResult.FAILURE)()
    tracer_provider.add_span_processor(BatchSpanProcessor(spans))
    trace.set_tracer_provider(tracer_provider)
    quiet_after_first()
    exported_metrics = guarded(OTLPMetricExporter, MetricExportResult.FAILURE)()
    reader = PeriodicExportingMetricReader(exported_metrics)
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    _providers.extend([tracer_provider, meter_provider])
    _export_logs(resource)
    atexit.register(shutdown_export)
    return True


def shutdown_export() -> None:
    """Flush and stop what ``configure_export`` set up (a proc's end, the client's exit)."""
    providers, _providers[:] = list(_providers), []
    if _factories:
        logging.setLogRecordFactory(_factories.pop())
    for provider in providers:
        provider.shutdown()
