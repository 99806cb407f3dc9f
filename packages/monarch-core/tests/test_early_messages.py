"""Messages for an actor this process does not have yet (the router's ``_hold``): they
wait ``message_delivery_timeout`` for its spawn, however long a spawn that has arrived
takes to read, and are refused once that spawn is abandoned (``spawn_abandoned``: its
actors could not be started), never kept forever. The client's own runtime, real ports."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Sequence
from typing import Any

from monarch.config import configured
from monarch.core._payload._serialize import loads
from monarch.core._runtime import current_runtime
from monarch.core._runtime._messages import TO_ACTOR, Body, Call, PortValue, ShapeSpec
from monarch.transport import Buffer

REFUSAL = 0.2
"""``message_delivery_timeout`` here: how long a held call waits for a spawn to arrive."""


def _held_call() -> tuple[str, queue.Queue[tuple[Body, Any]], Call]:
    """A call for an actor of this process that is not here, and the queue its answer
    comes to."""
    runtime = current_runtime()
    answers: queue.Queue[tuple[Body, Any]] = queue.Queue()

    def answer(body: Body, payload: Sequence[Buffer]) -> None:
        answers.put((body, loads(payload) if payload else None))

    dest = f"ghost-{uuid.uuid4().hex[:8]}"
    reply = runtime.open_port(answer)
    call = Call(dest, "ping", ShapeSpec((), 0, (), ()), reply)
    return dest, answers, call


def test_a_call_for_an_actor_never_spawned_is_refused_when_due() -> None:
    runtime = current_runtime()
    with configured(message_delivery_timeout=f"{REFUSAL * 1000:.0f}ms"):
        dest, answers, call = _held_call()
        runtime.post(runtime.address, TO_ACTOR, dest, call)
        body, failure = answers.get(timeout=30)
    assert isinstance(body, PortValue) and body.error
    assert "never spawned or gone" in str(failure.exception)


def test_a_call_for_an_abandoned_spawn_is_refused_and_not_before() -> None:
    """While the spawn is read, the call waits past the refusal's delay; once the spawn is
    abandoned it is refused at the next expiry."""
    runtime = current_runtime()
    with configured(message_delivery_timeout=f"{REFUSAL * 1000:.0f}ms"):
        dest, answers, call = _held_call()
        runtime.call_soon(runtime.spawn_arrived, dest)
        runtime.post(runtime.address, TO_ACTOR, dest, call)  # after it: same thread, in order
        try:
            answers.get(timeout=10 * REFUSAL)
        except queue.Empty:
            pass  # held: the spawn is being read
        else:
            raise AssertionError("a call for a spawn being read was refused")
        runtime.call_soon(runtime.spawn_abandoned, dest)
        body, failure = answers.get(timeout=30)
    assert isinstance(body, PortValue) and body.error
    assert "never spawned or gone" in str(failure.exception)
