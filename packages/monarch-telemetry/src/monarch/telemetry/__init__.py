"""monarch.telemetry: OpenTelemetry spans and metrics for Monarch (upstream's ``span``,
``traced``, ``get_meter``, also importable from ``monarch.actor``).

Importing it instruments this process: every call carries its trace context to the actors
it reaches, whose endpoints run in spans of that trace, with built-in metrics; procs spawned
afterwards are instrumented too. With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set and the ``otlp``
extra installed, spans and metrics of every process are exported over OTLP/HTTP.
``enable_telemetry()`` keeps the job's tables of meshes, actors, their status changes and
messages at the client, for SQL (``query_engine_client.query``, the ``sql`` extra).
"""

from ._instrumentation import install
from ._meter import get_meter
from ._spans import span, traced
from ._sql import (
    QueryEngineClient,
    TelemetryConfig,
    TelemetryQueryError,
    enable_telemetry,
)

install()

__all__ = [
    "QueryEngineClient",
    "TelemetryConfig",
    "TelemetryQueryError",
    "enable_telemetry",
    "get_meter",
    "install",
    "span",
    "traced",
]
