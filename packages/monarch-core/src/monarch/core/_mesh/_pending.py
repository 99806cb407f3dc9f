"""Procs still starting, as a value that can be sent.

``spawn_procs`` returns at once; the addresses of its procs come later. A ProcMesh (or an
actor mesh on it) sent before then carries a ``ProcsRef``: pickled, it is the spawning
process's address and a token, and the receiver asks that process (``ProcsOf``) for the
addresses, answered once the procs run. As upstream's pending references: a supervisor
hands a controller the mesh it just made, without waiting for it.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from typing import Any

from monarch.core._errors import RemoteFailure, SupervisionError
from monarch.core._payload._serialize import dumps
from monarch.core._runtime import Runtime, current_runtime
from monarch.core._runtime._messages import Body, PortValue, ProcsOf
from monarch.transport import Buffer

from ._ask import ask_body, settle_from_reply
from ._future import Future, Outcome

_registry: dict[str, ProcsRef] = {}
"""The procs this process spawns, by token: what ``ProcsOf`` asks about."""


class ProcsRef(Future[list[str]]):
    """The addresses of the procs of one ``spawn_procs``, by rank, once they run.

    Made by the spawning process (``spawning``) and completed when its procs report in;
    sent anywhere, it arrives as one that asks the spawner (see the module docstring).
    """

    __slots__ = ("owner", "token")

    owner: str
    token: str

    @classmethod
    def spawning(cls, owner: str) -> ProcsRef:
        """The addresses of procs that ``owner`` (this process) is starting."""
        ref = cls._ref(owner, uuid.uuid4().hex)
        _registry[ref.token] = ref
        return ref

    @classmethod
    def _ref(cls, owner: str, token: str) -> ProcsRef:
        ref: ProcsRef = cls._new()  # type: ignore[assignment]
        ref.owner = owner
        ref.token = token
        return ref

    def follow(self, source: Outcome[list[str]]) -> None:
        """Complete with what ``source`` completes with."""
        source.add_done_callback(lambda done: _copy(done, self))

    def forget(self) -> None:
        """Its mesh is stopped: later questions get an error, not the addresses."""
        _registry.pop(self.token, None)

    def __reduce__(self) -> Any:
        if self.done() and self._failure() is None:
            return (list, (self._wait(),))
        return (_ask_for_procs, (self.owner, self.token))


def _ask_for_procs(owner: str, token: str) -> ProcsRef:
    """The addresses of the procs ``token`` names, asked of the process ``owner`` that
    spawns them (a future: unpickling never waits)."""
    known = _registry.get(token)
    if known is not None:  # back home
        return known
    runtime = current_runtime()
    ref = ProcsRef._ref(owner, token)

    def ask() -> None:
        def then(body: Body | None, payload: Sequence[Buffer], error: BaseException | None) -> None:
            settle_from_reply(ref, body, payload, error, f"the procs' spawner at {owner} failed")

        ask_body(runtime, owner, functools.partial(ProcsOf, token), None, then)

    runtime.call_soon(ask)
    return ref


def _copy(done: Outcome[list[str]], into: Outcome[list[str]]) -> None:
    error = done._failure()
    if error is not None:
        into.set_exception(error)
    else:
        into.set_result(done._wait())


def handle_procs_of(
    runtime: Runtime, body: ProcsOf, payload: Sequence[Buffer], sender: str
) -> None:
    """Answer with the addresses once the procs run (or why they never will)."""
    ref = _registry.get(body.token)
    if ref is None:
        gone = SupervisionError("the proc mesh was stopped (or never spawned here)")
        runtime.send_to_port(body.reply, PortValue(0, True), dumps(RemoteFailure.of(gone, "")))
        return

    def answer(done: Outcome[list[str]]) -> None:
        error = done._failure()
        if error is not None:
            failure = RemoteFailure.of(error, "the procs failed to start")
            runtime.send_to_port(body.reply, PortValue(0, True), dumps(failure))
        else:
            runtime.send_to_port(body.reply, PortValue(0), dumps(done._wait()))

    ref.add_done_callback(answer)
