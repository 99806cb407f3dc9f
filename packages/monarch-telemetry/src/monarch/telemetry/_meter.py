"""``get_meter``: user metrics, exported with the built-in ones."""

from __future__ import annotations

from opentelemetry import metrics

from ._instrumentation import install


def get_meter(name: str = "monarch", version: str = "") -> metrics.Meter:
    """An OpenTelemetry meter (of the global meter provider: exported with the rest).
    Instruments this process, if it is not yet."""
    install()
    return metrics.get_meter(name, version)
