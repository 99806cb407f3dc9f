"""OTLP export, where the environment asks for it and the SDK is installed.

Each process (the client, every proc) sets up its own providers: spans and metrics leave
from where they happen, as OpenTelemetry's exporters expect. Nothing is set up when the
application has installed providers of its own.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from opentelemetry import metrics, trace

_providers: list[Any] = []


def wanted() -> bool:
    return any(
        os.environ.get(name)
        for name in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        )
    )


def configure_export(service: str) -> bool:
    """Export spans and metrics over OTLP/HTTP as ``service``; False if not asked for, the
    SDK is missing, or providers are set already."""
    if _providers or not wanted():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return False
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the application configured OpenTelemetry itself
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    _providers.extend([tracer_provider, meter_provider])
    atexit.register(shutdown_export)
    return True


def shutdown_export() -> None:
    """Flush and stop what ``configure_export`` set up (a proc's end, the client's exit)."""
    providers, _providers[:] = list(_providers), []
    for provider in providers:
        provider.shutdown()
