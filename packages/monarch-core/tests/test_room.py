"""An async actor's sender that outruns its peer: its task waits for the room at its next
``await`` while the loop's other tasks run (``_runtime._flow``: ``Room``, ``suspend_owed``),
on both event loops an actor may run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.core._runtime._flow import STALL, Room, owe, owed, suspend_senders

uvloop = pytest.importorskip("uvloop")


@pytest.fixture(params=["asyncio", "uvloop"])
def actor_loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    """A loop made as an async actor's is, run by the test's thread."""
    loop = asyncio.new_event_loop() if request.param == "asyncio" else uvloop.new_event_loop()
    suspend_senders(loop)
    try:
        yield loop
    finally:
        owed.suspends, owed.owed = False, None
        loop.close()


def test_a_sender_waits_at_its_next_await_while_the_loops_other_tasks_run(
    actor_loop: asyncio.AbstractEventLoop,
) -> None:
    room = Room()
    events: list[str] = []

    async def sender() -> None:
        owe(room)  # what a send past the lane's high-water mark does on an actor's loop
        events.append("sent")
        await asyncio.sleep(0)
        events.append("sender on")

    async def consumer() -> None:
        for _ in range(20):  # turns of the loop while the sender waits
            await asyncio.sleep(0)
        events.append("consumed")
        threading.Thread(target=room.set).start()  # the peer's room comes from another thread

    async def main() -> None:
        await asyncio.gather(asyncio.ensure_future(sender()), asyncio.ensure_future(consumer()))

    actor_loop.run_until_complete(main())
    assert events == ["sent", "consumed", "sender on"]


def test_a_room_that_never_comes_holds_the_sender_stall_seconds_at_most(
    actor_loop: asyncio.AbstractEventLoop,
) -> None:
    async def sender() -> float:
        owe(Room())
        began = time.monotonic()
        await asyncio.sleep(0)
        return time.monotonic() - began

    waited = actor_loop.run_until_complete(sender())
    assert STALL * 0.9 <= waited < 30


def test_a_sender_cancelled_while_it_waits_for_the_room_is_cancelled_inside(
    actor_loop: asyncio.AbstractEventLoop,
) -> None:
    room = Room()
    seen: list[str] = []

    async def sender() -> None:
        try:
            owe(room)
            await asyncio.Event().wait()  # the future it waits on is cancelled too
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    async def main() -> None:
        task = asyncio.ensure_future(sender())
        await asyncio.sleep(0)  # it has sent and waits for the room
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    actor_loop.run_until_complete(main())
    assert seen == ["cancelled inside"]


def test_a_set_room_lets_the_sender_on_at_once(actor_loop: asyncio.AbstractEventLoop) -> None:
    room = Room()
    room.set()

    async def sender() -> str:
        owe(room)
        await asyncio.sleep(0)
        return "on"

    assert actor_loop.run_until_complete(sender()) == "on"


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.sampled_from(["sleep", "owe", "raise", "future", "catch"]), min_size=0, max_size=12
    )
)
def test_a_wrapped_coroutine_returns_and_raises_as_it_would_unwrapped(steps: list[str]) -> None:
    """Whatever a coroutine does (awaits, raises, catches), the suspending wrapper gives the
    same result and the same order of events as the coroutine run plainly."""

    async def program(trace: list[Any]) -> int:
        done = 0
        for step in steps:
            if step == "sleep":
                await asyncio.sleep(0)
            elif step == "owe":
                room = Room()
                asyncio.get_running_loop().call_soon(room.set)
                owe(room)
                await asyncio.sleep(0)
            elif step == "future":
                future = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_soon(future.set_result, done)
                trace.append(await future)
            elif step == "catch":
                try:
                    raise KeyError(done)
                except KeyError as exc:
                    trace.append(("caught", exc.args[0]))
            else:
                raise ValueError(done)
            done += 1
        return done

    def run(suspending: bool) -> tuple[Any, list[Any]]:
        loop = asyncio.new_event_loop()
        if suspending:
            suspend_senders(loop)
        trace: list[Any] = []
        try:
            return loop.run_until_complete(program(trace)), trace
        except ValueError as exc:
            return ("raised", exc.args), trace
        finally:
            owed.suspends, owed.owed = False, None
            loop.close()

    assert run(True) == run(False)
