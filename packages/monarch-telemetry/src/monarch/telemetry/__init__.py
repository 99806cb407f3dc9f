"""monarch.telemetry: OpenTelemetry spans and metrics for Monarch (upstream's ``span``,
``traced``, ``get_meter``, also importable from ``monarch.actor``).

Importing it instruments this process: every call carries its trace context to the actors
it reaches, whose endpoints run in spans of that trace, with built-in metrics; procs spawned
afterwards are instrumented too. With ``OTEL_EXPORTER_OTLP_ENDPOINT`` set and the ``otlp``
extra installed, spans and metrics of every process are exported over OTLP/HTTP.
"""

from ._instrumentation import install
from ._meter import get_meter
from ._spans import span, traced

install()

__all__ = ["get_meter", "install", "span", "traced"]
