"""The tracer and the built-in instruments the core's hooks record into."""

from __future__ import annotations

from functools import cache
from typing import Final

from opentelemetry import metrics, trace

TRACER: Final = "monarch"


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER)


class Instruments:
    """What the core's hooks record, on both sides of a call."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.sent = meter.create_counter(
            "monarch.calls.sent", unit="{call}", description="Calls sent (once per cast)"
        )
        self.handled = meter.create_counter(
            "monarch.endpoint.calls", unit="{call}", description="Endpoint calls handled"
        )
        self.errors = meter.create_counter(
            "monarch.endpoint.errors", unit="{call}", description="Endpoint calls that raised"
        )
        self.duration = meter.create_histogram(
            "monarch.endpoint.duration", unit="s", description="Time in the endpoint's code"
        )
        self.payload = meter.create_histogram(
            "monarch.endpoint.payload", unit="By", description="Bytes of a call's arguments"
        )
        self.queue_depth = meter.create_gauge(
            "monarch.actor.queue_depth",
            unit="{message}",
            description="Messages queued for an actor when one of its endpoints starts",
        )
        self.supervision = meter.create_counter(
            "monarch.supervision.events",
            unit="{event}",
            description="Failed actors reported to this process, their owner (supervision)",
        )


@cache
def instruments() -> Instruments:
    return Instruments(metrics.get_meter("monarch"))
