"""Whether the OTLP collector answers, so that a job without one neither waits nor shouts.

The SDK's exporters retry a refused or silent endpoint with backoff for up to their timeout
(10 s) per batch and signal, each retry a log line, and again at exit: a one-second script
took 18 s to end and printed ~20 lines. Here an export first checks that the collector
accepts a TCP connection (at most once per ``RECHECK`` seconds while it does not); while it
does not, batches are dropped at once and the user is told once, per process, where it was.
Once it answered, exports go straight to it, without a probe each, until one fails.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Final
from urllib.parse import urlsplit

log = logging.getLogger("monarch.telemetry")

CONNECT_TIMEOUT: Final = 1.0
"""Seconds a probe waits for the collector to accept (a dropped packet is not a refusal)."""
RECHECK: Final = 10.0
"""Seconds between probes of a collector that did not answer."""
told_at = logging.WARNING
"""How loudly this process says so: the client warns; procs (whose lines the client would
show again, one per proc) only log it (``configure_export``)."""


def endpoint_address(url: str) -> tuple[str, int] | None:
    """The host and port an OTLP/HTTP endpoint URL names (its scheme's default port)."""
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


class Collector:
    """One collector's reachability, shared by the exporters (spans, metrics, logs) that
    send to it."""

    def __init__(self, address: tuple[str, int] | None) -> None:
        self.address = address
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._up = False
        """It accepted a connection and no export to it failed since."""
        self._told = False

    def reachable(self) -> bool:
        """Whether to export now: the collector answered and no export failed since, or
        it accepts a connection now (probed at most once per ``RECHECK`` while it refuses)."""
        if self.address is None or self._up:
            return True  # no address to probe: let the exporter say what is wrong
        with self._lock:
            if time.monotonic() < self._down_until:
                return False
            try:
                socket.create_connection(self.address, timeout=CONNECT_TIMEOUT).close()
            except OSError as exc:
                self._down_until = time.monotonic() + RECHECK
                if not self._told:
                    self._told = True
                    log.log(
                        told_at,
                        "the OTLP collector at %s:%s is unreachable (%s): telemetry is dropped "
                        "until it answers (OTEL_EXPORTER_OTLP_ENDPOINT)",
                        *self.address,
                        exc.strerror or exc,
                    )
                return False
            self._down_until = 0.0
            self._up = True
            return True

    def failed(self) -> None:
        """An export to it failed: probe it again before the next."""
        self._up = False


_collectors: dict[tuple[str, int] | None, Collector] = {}


def collector(url: str) -> Collector:
    """The one ``Collector`` of the host and port ``url`` names, in this process."""
    address = endpoint_address(url)
    found = _collectors.get(address)
    if found is None:
        found = _collectors.setdefault(address, Collector(address))
    return found


def guarded(exporter: type[Any], failure: Any) -> type[Any]:
    """A subclass of the SDK's ``exporter`` that exports only while its collector answers,
    and otherwise returns ``failure`` (the SDK drops that batch) without waiting."""

    class Guarded(exporter):  # type: ignore[misc]
        def export(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
            target = collector(str(self._endpoint))
            if not target.reachable():
                return failure
            result = super().export(batch, *args, **kwargs)
            if result == failure:
                target.failed()
            return result

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{exporter.__name__}"
    return Guarded


_quieted: list[bool] = []


def quiet_after_first() -> None:
    """Between a probe that passed and an export that failed, the SDK may still retry:
    its retry lines are shown once per exporter logger, later ones dropped. Once per
    process (export may be configured again after a shutdown)."""
    if _quieted:
        return
    _quieted.append(True)
    seen: set[str] = set()

    def once(record: logging.LogRecord) -> bool:
        if "Transient error" not in str(record.msg):
            return True
        if record.name in seen:
            return False
        seen.add(record.name)
        return True

    for name in (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry.exporter.otlp.proto.http.metric_exporter",
        "opentelemetry.exporter.otlp.proto.http._log_exporter",
        "opentelemetry.exporter.otlp.proto.http._common._http",
    ):
        logging.getLogger(name).addFilter(once)
