"""A client whose calls the telemetry test follows (run as its own process, exporting to
the OTLP receiver the test gives it in ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""

from __future__ import annotations

import json
import logging

import monarch.actor
from monarch.actor import Actor, ActorError, endpoint, this_host
from monarch.telemetry import get_meter, install, span, traced


class Helper(Actor):
    @endpoint
    def work(self, x: int) -> int:
        return x + 100


class Worker(Actor):
    @endpoint
    def work(self, x: int) -> int:
        logging.getLogger("worker").warning("working on %d", x)
        with span("inner"):
            return x + 1

    @endpoint
    def take(self, data: bytes) -> int:
        return len(data)

    @endpoint
    def fail(self) -> None:
        raise ValueError("bad input")

    @endpoint
    def relay(self, helper: Helper) -> int:
        value: int = helper.work.call_one(5).get()
        return value


class Dying(Actor):
    @endpoint
    def die(self) -> None:
        raise SystemExit(3)  # a BaseException: the actor fails, a supervision event


class AsyncWorker(Actor):
    @endpoint
    async def work(self, x: int) -> int:
        return await self.double(x)

    @traced(name="double-it")
    async def double(self, x: int) -> int:
        return 2 * x


def main() -> None:
    install()  # before spawning: the procs are instrumented too
    monarch.actor.unhandled_fault_hook = lambda failure: None
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("workers", Worker)
    helper = procs.slice(gpus=1).spawn("helper", Helper)
    asyncs = procs.spawn("asyncs", AsyncWorker)
    with span("client-step") as step:
        logging.getLogger("client").warning("stepping")
        values = workers.work.call(1).get()
        doubled = asyncs.work.call(4).get()
    with span("client-relay") as relay:
        relayed = workers.slice(gpus=0).relay.call_one(helper).get()
    try:
        workers.slice(gpus=0).fail.call_one().get()
    except ActorError:
        failed = True
    workers.take.call(b"x" * 100_000).get()  # the payload instrument's bytes
    try:
        procs.slice(gpus=1).spawn("dying", Dying).die.call_one().get()
    except Exception:  # noqa: BLE001 - a SupervisionError: the actor failed
        pass
    get_meter("user").create_counter("user.things").add(3)
    procs.stop().get()
    print(
        json.dumps(
            {
                "step": format(step.get_span_context().trace_id, "032x"),
                "relay": format(relay.get_span_context().trace_id, "032x"),
                "values": sorted(values.values()),
                "doubled": sorted(doubled.values()),
                "relayed": relayed,
                "failed": failed,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
