"""Asking a proc a question and waiting for its answer, and the services that answer.

Every question one process puts to another (what a proc holds, how a proc ended, the
addresses of procs still starting, the job's controller, what monarch-admin shows) is the
same three things: a reply port opened for the answer, a watch on the peer so that its
death ends the wait at once, and a deadline. ``ask_body`` does the three, once, on the
runtime loop, for the core's own control messages (which carry their reply port).

``Service`` is the way to add a question: a named handler that every proc serves, whose
requests are a msgspec tagged union of Structs. ``ask(address, request, timeout)`` sends
one request to the service that takes its type and returns the decoded answer; a proc
that cannot read a request (a type its service does not know) answers with an error
that says so, never silence.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from concurrent.futures import Future as Deferred
from typing import Any, Final, Generic, TypeVar

import msgspec

from monarch.core._errors import MonarchError, PeerLost, RemoteFailure, SupervisionError
from monarch.core._payload._serialize import loads
from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._messages import TO_PROC, AskService, Body, PortRef, PortValue
from monarch.transport import Buffer

from ._future import Future, Outcome, submit_into

Req = TypeVar("Req")

ASK_TIMEOUT: Final = 10.0
"""Seconds ``ask`` waits for an answer unless told otherwise."""

Answered = Callable[[Body | None, Sequence[Buffer], BaseException | None], None]
"""Called once with the answer and its payload, or with why there is none."""


class ServiceError(MonarchError):
    """A proc's service could not answer a request (it failed, or could not read it)."""


def ask_body(
    runtime: Runtime,
    address: str,
    question: Callable[[PortRef], Body],
    timeout: float | None,
    then: Answered,
    payload: Sequence[Buffer] = (),
) -> None:
    """Post ``question(reply_port)`` to the proc at ``address`` and call ``then`` once.

    ``then`` gets the first message on the reply port, or ``PeerLost`` as soon as the
    peer is declared dead, or ``TimeoutError`` past ``timeout`` seconds (``None``: no
    deadline). Runs on the runtime loop; the port and the watch are closed before
    ``then`` runs.
    """
    done = False
    timer: Any = None

    def finish(body: Body | None, data: Sequence[Buffer], error: BaseException | None) -> None:
        nonlocal done
        if done:
            return
        done = True
        runtime.close_port(port)
        runtime.unwatch_peer(address, watch)
        if timer is not None:
            timer.cancel()
        then(body, data, error)

    def lost(peer: str, why: BaseException) -> None:
        finish(None, (), PeerLost(f"proc {peer} is gone: {why}"))

    def late() -> None:
        finish(None, (), TimeoutError(f"proc {address} did not answer within {timeout:g}s"))

    port = runtime.open_port(lambda body, data: finish(body, data, None))
    watch = runtime.watch_peer(address, lost)
    if timeout is not None:
        timer = runtime.loop.call_later(max(0.0, timeout), late)
    runtime.post(address, TO_PROC, "", question(port), payload)


class Service(Generic[Req]):
    """A named handler served on every proc; its requests are a union of msgspec Structs.

    Making one registers it in this process (do it at import time of a module every proc
    imports, so every proc serves it). ``handler`` runs on the proc's runtime loop and
    returns the answer (anything msgspec encodes); what it raises goes back to the asker
    as a ``ServiceError``. ``answers`` is the type the asker decodes the answer as. A
    request that would hold the loop (a large copy) may be answered later: the handler
    returns a ``concurrent.futures.Future`` of the answer, run where it chooses.
    """

    __slots__ = ("_decoder", "answers", "handler", "name", "requests")

    def __init__(
        self,
        name: str,
        requests: Any,
        handler: Callable[[Req], Any],
        answers: Any = Any,
    ) -> None:
        if name in _services:
            raise ValueError(f"a service named {name!r} is already registered")
        self.name = name
        self.requests = requests
        self.handler = handler
        self.answers = answers
        self._decoder: msgspec.msgpack.Decoder[Req] = msgspec.msgpack.Decoder(requests)
        kinds = typing.get_args(requests) or (requests,)
        for kind in kinds:
            other = _by_type.get(kind)
            if other is not None:
                raise ValueError(f"{kind.__name__} is already a request of service {other.name!r}")
        _services[name] = self
        for kind in kinds:
            _by_type[kind] = self

    def __repr__(self) -> str:
        return f"Service({self.name!r})"

    def answer(self, data: bytes) -> bytes | Deferred[Any]:
        """The encoded answer to one encoded request, or a future of the (not yet
        encoded) answer (raises ``ServiceError``)."""
        try:
            request = self._decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise ServiceError(f"service {self.name!r} cannot read the request: {exc}") from None
        value = self.handler(request)
        return value if isinstance(value, Deferred) else _encoder.encode(value)


_services: dict[str, Service[Any]] = {}
"""The services this process serves, by name."""
_by_type: dict[type, Service[Any]] = {}
"""Which service takes each request type."""
_encoder: Final = msgspec.msgpack.Encoder()


def service_for(request: object) -> Service[Any]:
    """The service that takes ``request``'s type (``TypeError`` if none)."""
    found = _by_type.get(type(request))
    if found is None:
        raise TypeError(f"no Service takes requests of type {type(request).__name__}")
    return found


def ask(
    address: str,
    request: msgspec.Struct,
    timeout: float | None = ASK_TIMEOUT,
    *,
    service: str | None = None,
) -> Future[Any]:
    """Ask the proc at ``address`` the ``request`` of a ``Service``; its decoded answer.

    From any thread; the future fails with ``PeerLost`` as soon as the proc is known to
    be dead, with ``TimeoutError`` past ``timeout`` seconds, and with ``ServiceError``
    when the proc's service failed or could not read the request. ``service`` names the
    service outright (a request its union may not hold: the proc says so).
    """
    if service is None:
        chosen = service_for(request)
        name, answers = chosen.name, chosen.answers
    else:
        name, answers = service, Any
    data = _encoder.encode(request)
    runtime = current_runtime()

    def start(result: Future[Any]) -> None:
        def then(body: Body | None, payload: Sequence[Buffer], error: BaseException | None) -> None:
            if error is not None:
                result.set_exception(error)
                return
            try:
                value = read_answer(name, body, payload, answers)
            except Exception as exc:  # noqa: BLE001 - the asker gets it
                result.set_exception(exc)
            else:
                result.set_result(value)

        ask_body(runtime, address, lambda port: AskService(name, data, port), timeout, then)

    return submit_into(runtime, start)


def settle_from_reply(
    result: Outcome[Any],
    body: Body | None,
    payload: Sequence[Buffer],
    error: BaseException | None,
    what: str,
) -> None:
    """Complete ``result`` with a pickled ``PortValue`` reply (the core's control
    questions whose answers are Python objects), or fail it: a lost peer is a
    ``SupervisionError`` naming ``what`` the asker waited for."""
    if isinstance(error, PeerLost):
        result.set_exception(SupervisionError(f"{what}: {error}"))
    elif error is not None:
        result.set_exception(error)
    elif not isinstance(body, PortValue):
        result.set_exception(MonarchError(f"{what}: unexpected answer {type(body).__name__}"))
    else:
        try:
            value = loads(payload)
        except Exception as exc:  # noqa: BLE001 - a reply that cannot be read fails it
            result.set_exception(exc)
            return
        if body.error:
            failure = value.to_error() if isinstance(value, RemoteFailure) else value
            result.set_exception(
                failure if isinstance(failure, BaseException) else MonarchError(str(failure))
            )
        else:
            result.set_result(value)


def read_answer(name: str, body: Body | None, payload: Sequence[Buffer], answers: Any) -> Any:
    """The value a service's reply carries (raises the ``ServiceError`` it carries)."""
    if not isinstance(body, PortValue):
        raise ServiceError(f"service {name!r} answered with {type(body).__name__}")
    data = b"".join(bytes(part) for part in payload)
    if body.error:
        raise ServiceError(msgspec.msgpack.decode(data, type=str))
    return msgspec.msgpack.decode(data, type=answers)


def handle_ask_service(
    runtime: Runtime, body: AskService, payload: Sequence[Buffer], sender: str
) -> None:
    """Answer one request to a service of this proc (an error if it cannot)."""
    service = _services.get(body.service)
    try:
        if service is None:
            raise ServiceError(f"no service named {body.service!r} on proc {runtime.address}")
        answer = service.answer(body.request)
    except Exception as exc:  # noqa: BLE001 - the asker learns why
        _refuse(runtime, body.reply, exc)
        return
    if isinstance(answer, Deferred):
        answer.add_done_callback(lambda done: _send_later(runtime, body.reply, done))
    else:
        runtime.send_to_port(body.reply, PortValue(0), [answer])


def _refuse(runtime: Runtime, reply: PortRef, exc: BaseException) -> None:
    text = str(exc) if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
    runtime.send_to_port(reply, PortValue(0, True), [_encoder.encode(text)])


def _send_later(runtime: Runtime, reply: PortRef, done: Deferred[Any]) -> None:
    """Send a deferred answer (from the thread that completed it: ``send_to_port`` is
    thread-safe)."""
    try:
        data = _encoder.encode(done.result())
    except BaseException as exc:  # noqa: BLE001 - the asker learns why
        _refuse(runtime, reply, exc)
    else:
        runtime.send_to_port(reply, PortValue(0), [data])
