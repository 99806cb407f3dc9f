"""The tracer and the built-in instruments the core's hooks record into.

The per-call counts (calls sent, handled, failed) and each actor's queue depth are kept
here, a dict update per call, and read by the SDK when it collects (observable
instruments): a measurement through the SDK costs a call microseconds (its attributes
hashed, an exemplar sampled) where the hooks should cost almost nothing. The histograms
(durations, payload sizes) are recorded per call: their buckets need each value.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import cache
from typing import Final

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

TRACER: Final = "monarch"


@cache
def tracer() -> trace.Tracer:
    """The hooks' tracer (asked once: a proxy until an SDK is installed, then the SDK's)."""
    return trace.get_tracer(TRACER)


class Tally:
    """Cumulative counts per value of one attribute, read by an observable counter."""

    def __init__(self, attribute: str) -> None:
        self.attribute = attribute
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, value: str, n: int = 1) -> None:
        with self._lock:
            self._counts[value] = self._counts.get(value, 0) + n

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            counts = list(self._counts.items())
        return [Observation(n, {self.attribute: value}) for value, n in counts]


class Latest:
    """The last value per value of one attribute, read by an observable gauge."""

    def __init__(self, attribute: str) -> None:
        self.attribute = attribute
        self._values: dict[str, int] = {}

    def set(self, value: str, n: int) -> None:
        self._values[value] = n  # one store: atomic

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {self.attribute: v}) for v, n in list(self._values.items())]


class Instruments:
    """What the core's hooks record, on both sides of a call."""

    def __init__(self, meter: metrics.Meter) -> None:
        def tally(name: str, description: str) -> Tally:
            counts = Tally("monarch.endpoint")
            meter.create_observable_counter(name, [counts.observe], "{call}", description)
            return counts

        self.sent = tally("monarch.calls.sent", "Calls sent (once per cast)")
        self.handled = tally("monarch.endpoint.calls", "Endpoint calls handled")
        self.errors = tally("monarch.endpoint.errors", "Endpoint calls that raised")
        self.duration = meter.create_histogram(
            "monarch.endpoint.duration", unit="s", description="Time in the endpoint's code"
        )
        self.payload = meter.create_histogram(
            "monarch.endpoint.payload", unit="By", description="Bytes of a call's arguments"
        )
        self.queue_depth = Latest("monarch.actor")
        meter.create_observable_gauge(
            "monarch.actor.queue_depth",
            [self.queue_depth.observe],
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
