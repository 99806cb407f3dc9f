"""``ask`` and ``Service`` (``monarch.core.lowlevel``): one question to a proc, answered by
a named handler every proc serves; a dead proc, a deadline and an unreadable request
each end the wait with a clear error."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.core import PeerLost, current_runtime, spawned_procs
from monarch.core.lowlevel import (
    PROC_SERVICE,
    Introspect,
    Service,
    ServiceError,
    ask,
    snapshot_procs,
)

pytestmark = pytest.mark.ours_only


class Echo(msgspec.Struct, tag="echo", frozen=True):
    text: str
    times: int = 1


class Fail(msgspec.Struct, tag="fail", frozen=True):
    why: str


class Unknown(msgspec.Struct, tag="unknown", frozen=True):
    """A request no service here takes (a newer asker's, say)."""

    x: int


def _answer(request: Echo | Fail) -> Any:
    if isinstance(request, Fail):
        raise ValueError(request.why)
    return [request.text * request.times, os.getpid()]


ECHO = Service("test-echo", Echo | Fail, _answer, answers=tuple[str, int])
"""Registered wherever this module is imported: in every proc that unpickles ``Probe``."""


class Later(msgspec.Struct, tag="later", frozen=True):
    """Answered from another thread, after the handler returned (``fail``: with an error)."""

    text: str
    fail: bool = False


def _answer_later(request: Later) -> Future[str]:
    done: Future[str] = Future()

    def work() -> None:
        if request.fail:
            done.set_exception(ValueError(request.text))
        else:
            done.set_result(f"{request.text} from {threading.current_thread().name}")

    threading.Thread(target=work, name="later-worker").start()
    return done


LATER = Service("test-later", Later, _answer_later, answers=str)


class Probe(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"gpus": 1}, name="asked")
    mesh.spawn("probe", Probe).pid.call_one().get(timeout=60)
    yield mesh
    mesh.stop().get(timeout=30)


def address_of(name: str) -> str:
    [proc] = [p for p in spawned_procs() if p.mesh == name]
    assert proc.address is not None
    return proc.address


def test_a_service_answers_on_a_proc_and_its_errors_come_back(procs: ProcMesh) -> None:
    address = address_of("asked")
    text, pid = ask(address, Echo("ab", 3), timeout=30).get(timeout=60)
    assert text == "ababab" and pid != os.getpid()
    with pytest.raises(ServiceError, match="ValueError: no reason"):
        ask(address, Fail("no reason"), timeout=30).get(timeout=60)


def test_a_handler_may_answer_later_from_another_thread(procs: ProcMesh) -> None:
    address = address_of("asked")
    assert ask(address, Later("hi"), timeout=30).get(timeout=60) == "hi from later-worker"
    with pytest.raises(ServiceError, match="ValueError: broke"):
        ask(address, Later("broke", fail=True), timeout=30).get(timeout=60)


def test_a_request_of_an_unknown_type_gets_a_clear_error_back(procs: ProcMesh) -> None:
    address = address_of("asked")
    with pytest.raises(ServiceError, match=r"service 'test-echo' cannot read the request"):
        ask(address, Unknown(1), timeout=30, service="test-echo").get(timeout=60)
    with pytest.raises(ServiceError, match=r"no service named 'nope'"):
        ask(address, Echo("a"), timeout=30, service="nope").get(timeout=60)
    with pytest.raises(TypeError, match="no Service takes requests of type Unknown"):
        ask(address, Unknown(1))


def test_the_proc_service_answers_for_the_client_itself() -> None:
    address = current_runtime().address
    snap = ask(address, Introspect(stacks=True), timeout=30).get(timeout=60)
    assert snap.pid == os.getpid() and "MainThread" in [t.name for t in snap.stacks]
    [(where, answer)] = snapshot_procs([address]).items()
    assert where == address and not isinstance(answer, BaseException)


def test_ask_past_its_timeout_raises_and_a_dead_proc_fails_it_at_once() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="ask-dead")
    pid = procs.spawn("probe", Probe).pid.call_one().get(timeout=60)
    address = address_of("ask-dead")
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(TimeoutError, match=r"did not answer within 0\.2s"):
            ask(address, Echo("x"), timeout=0.2).get(timeout=60)
        asked = ask(address, Echo("x"), timeout=None)  # no deadline: only the death ends it
    finally:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(PeerLost, match="is gone"):
        asked.get(timeout=60)
    with pytest.raises(PeerLost):  # asked after its death: at once, never the deadline
        ask(address, Echo("x"), timeout=None).get(timeout=60)


def test_a_service_name_or_request_type_is_registered_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        Service("test-echo", Unknown, _answer)
    with pytest.raises(ValueError, match="Echo is already a request of service 'test-echo'"):
        Service("test-other", Echo, _answer)
    assert PROC_SERVICE.name == "proc"


requests = st.one_of(
    st.builds(Echo, st.text(), st.integers(-(2**63), 2**63 - 1)),
    st.builds(Fail, st.text()),
)


@given(requests)
def test_the_union_round_trips(request: Echo | Fail) -> None:
    data = msgspec.msgpack.encode(request)
    assert msgspec.msgpack.decode(data, type=ECHO.requests) == request


@given(st.booleans())
def test_proc_queries_round_trip(stacks: bool) -> None:
    query = Introspect(stacks)
    assert (
        msgspec.msgpack.decode(msgspec.msgpack.encode(query), type=PROC_SERVICE.requests) == query
    )
