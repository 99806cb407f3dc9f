"""monarch.telemetry: OpenTelemetry spans and metrics for Monarch (upstream's ``span``,
``traced``, ``get_meter``, also importable from ``monarch.actor``).

Using it instruments this process (``install()``, done by ``span``, ``traced``,
``get_meter``, ``enable_telemetry``, and by ``from monarch.actor import span``): every call
carries its trace context to the actors it reaches, whose endpoints run in spans of that
trace, with built-in metrics; procs spawned afterwards are instrumented too. Importing it
changes nothing. With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set and the ``otlp``
extra installed, spans and metrics of every process are exported over OTLP/HTTP.
``enable_telemetry()`` keeps the job's tables of meshes, actors, their status changes and
messages at the client, and periodic snapshots of its procs and actors, for SQL
(``query_engine_client.query``, the ``sql`` extra), and the job's timeline from them as a
Perfetto trace (``write_perfetto``).
"""

from ._instrumentation import enable_telemetry, install
from ._meter import get_meter
from ._perfetto import perfetto_trace, write_perfetto
from ._spans import span, traced
from ._sql import QueryEngineClient, TelemetryConfig, TelemetryQueryError, job_query

__all__ = [
    "QueryEngineClient",
    "TelemetryConfig",
    "TelemetryQueryError",
    "enable_telemetry",
    "get_meter",
    "install",
    "job_query",
    "perfetto_trace",
    "span",
    "traced",
    "write_perfetto",
]
