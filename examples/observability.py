"""Observability: 8 actors log, one fails; the client sees their logs aggregated, the failed
actor's traceback, the trace that links its call to the failing actor's span, and the
messages each actor handled, by SQL over the job's telemetry tables.

    python examples/observability.py

Needs monarch-telemetry with its ``otlp`` and ``sql`` extras. Spans go over OTLP/HTTP to
the endpoint in ``OTEL_EXPORTER_OTLP_ENDPOINT`` (a collector, Jaeger...); without one, this
script starts a stand-in that accepts and drops them, so that every process records its
spans.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Sink(BaseHTTPRequestHandler):
    """A stand-in OTLP/HTTP endpoint: accepts what is exported, keeps nothing."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    _server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=_server.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{_server.server_address[1]}"

from opentelemetry import trace  # noqa: E402 - after the endpoint is known

import monarch.actor  # noqa: E402
from monarch.actor import Actor, ActorError, current_rank, endpoint, span, this_host  # noqa: E402
from monarch.config import configure  # noqa: E402
from monarch.telemetry import enable_telemetry  # noqa: E402


def trace_id() -> str:
    return format(trace.get_current_span().get_span_context().trace_id, "032x")


class Trainer(Actor):
    @endpoint
    def train(self, step: int) -> float:
        rank = current_rank().rank
        loss = 1.0 / (step + rank + 1)
        print(f"step {step} loss {loss:.2f}", flush=True)  # alike on every rank: aggregated
        if rank == 3:
            raise ValueError(f"rank 3 diverged at step {step} (trace {trace_id()})")
        return loss


async def main() -> None:
    monarch.actor.unhandled_fault_hook = lambda failure: print(f"fault: {failure}")
    configure(enable_log_forwarding=True, procs_per_process=4)  # 8 procs in 2 processes
    tables = enable_telemetry()  # before spawning: the procs report to this client
    procs = this_host().spawn_procs(per_host={"gpus": 8})
    await procs.logging_option(stream_to_client=True, aggregate_window_sec=1)
    trainers = procs.spawn("trainers", Trainer)
    with span("training step"):
        client_trace = trace_id()
        try:
            await trainers.train.call(0)
        except ActorError as error:
            print("== the failed actor's error, with its traceback:")
            print(error.exception_formatted)
            linked = client_trace in str(error.exception)
            print(f"== its span is in the client's trace {client_trace}: {linked}")
    query = (
        "SELECT a.display_name AS actor, count(*) AS calls FROM messages m "
        "JOIN actors a ON a.id = m.to_actor_id GROUP BY 1 ORDER BY 1"
    )
    deadline = time.monotonic() + 10
    handled = tables.query(query)["rows"]
    while sum(row["calls"] for row in handled) < 8 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # procs send their rows every 0.2 s
        handled = tables.query(query)["rows"]
    print("== messages handled per actor:", {row["actor"]: row["calls"] for row in handled})
    await procs.stop()  # prints the aggregated logs still in their window
    print("== stopped")


if __name__ == "__main__":
    asyncio.run(main())
