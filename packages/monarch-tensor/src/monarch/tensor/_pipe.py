"""Pipes (upstream's ``Pipe``, ``create_pipe``, ``remote_generator``): a generator running
beside each proc's worker (a data loader, say), whose yielded values the controller takes
as monarch Tensors with ``pipe.recv()``, and which takes what the controller sends it with
``pipe.send(obj)``.

Upstream runs the generator in a subprocess of each proc, over an ipc socket (and 0.7.0's
panics on a proc mesh); here it runs on a thread of the proc, handing values through
queues: the generator's own work overlaps the worker's, as upstream's does, but shares its
process. The controller learns the shapes of what ``recv()`` gives from the remote
function's ``propagate``: a generator of the same arguments yielding tensors shaped alike
(the same as upstream's annotation); what ``send`` sent reaches its ``pipe.recv()``.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from monarch.core import context, loads

from ._active import current_client
from ._commands import Pickled
from ._flat import flatten_call
from ._remote import Remote, remote
from ._tensor import Tensor, dispatch

RECV_WAIT = 120.0
"""Seconds a worker's ``recv`` waits for its generator's next value."""

_pipes: dict[str, _WorkerPipe] = {}
"""This process's pipes, by key (several meshes' workers may share a process)."""
_END = object()


class Pipe:
    """The controller's end of a pipe to ``fn(pipe, *args, **kwargs)`` on every proc of
    the active mesh (``fn`` a remote generator function whose ``propagate`` is a generator
    too, yielding what ``fn`` yields, shaped alike)."""

    def __init__(self, fn: Any, max_messages: int, args: Any, kwargs: Any) -> None:
        client = current_client()
        if client is None:
            raise ValueError(
                "Remote generators require an active device mesh (use `with mesh.activate():`)"
            )
        if not isinstance(fn, Remote):
            raise TypeError("expected fn to be a monarch.remote function.")
        if not callable(fn._propagate):
            raise ValueError(
                "a pipe needs its remote function's propagate=: a generator of the same "
                "arguments yielding what it yields (tensors shaped alike)"
            )
        if any(isinstance(x, Tensor) for x in flatten_call(args, kwargs)[0]):
            raise ValueError("Cannot pass references to external generators")
        self._client = client
        self._key = client.transfer_key()
        self._fake = FakePipe()
        self._shapes: Iterator[Any] = iter(fn._propagate(self._fake, *args, **kwargs))
        start = _Start(self._key, fn._wired(), max_messages)
        dispatch(start, args, kwargs, client, meta_func=_nothing, wire=start)

    def recv(self) -> Any:
        """The generator's next value, as monarch Tensors (each proc's its own)."""
        receive = _Recv(self._key)
        return dispatch(receive, (), {}, self._client, meta_func=self._next, wire=receive)

    def send(self, obj: Any) -> None:
        """Hand ``obj`` (monarch Tensors of this mesh, or plain values) to the generator:
        its ``pipe.recv()`` gets it (each proc its own shards)."""
        tensors = [x for x in flatten_call((obj,), {})[0] if isinstance(x, Tensor)]
        if any(t._client is not self._client for t in tensors):
            raise ValueError("a pipe takes monarch Tensors of its own mesh only")
        send = _Send(self._key)
        dispatch(send, (obj,), {}, self._client, meta_func=self._fake._sent, wire=send)

    def _next(self) -> Any:
        try:
            return next(self._shapes)
        except StopIteration:
            raise ValueError(
                "the pipe's propagate generator ended: it has no more values"
            ) from None

    @property
    def ranks(self) -> dict[str, int]:
        raise ValueError("cannot be accessed on controller")

    @property
    def sizes(self) -> dict[str, int]:
        raise ValueError("cannot be accessed on controller")


class FakePipe:
    """The pipe that the controller's ``propagate`` generator is given: its ``recv()`` gives
    what the controller sent (meta tensors)."""

    def __init__(self) -> None:
        self._sends: deque[Any] = deque()

    def _sent(self, obj: Any) -> None:
        self._sends.append(obj)

    def recv(self) -> Any:
        return self._sends.popleft() if self._sends else None

    def send(self, obj: Any) -> None:
        raise RuntimeError(
            "Rather than p.send(x) use yield x to simulate a pipe worker sending data."
        )


class _WorkerPipe:
    """The generator's end, on a proc: ``recv()`` what the controller sent, ``send(x)`` (or
    ``yield x``) what the controller's ``recv()`` gets; ``ranks``/``sizes``: the proc's."""

    def __init__(self, max_messages: int) -> None:
        here = context().message_rank
        self.ranks = {label: here[label] for label in here.extent.labels}
        self.sizes = dict(here.extent.items())
        self.outbox: queue.Queue[Any] = queue.Queue(max_messages)
        self.inbox: queue.Queue[Any] = queue.Queue()

    def recv(self) -> Any:
        return self.inbox.get()

    def send(self, obj: Any) -> None:
        self.outbox.put(obj)


class _Start:
    """Start the generator on this proc, on a thread of its own."""

    def __init__(self, key: str, fn: Pickled, max_messages: int) -> None:
        self.key = key
        self.fn = fn
        self.max_messages = max_messages
        self.__qualname__ = f"{fn.name} (pipe)"

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        fn: Callable[..., Any] = loads(self.fn.parts)
        pipe = _pipes[self.key] = _WorkerPipe(self.max_messages)

        def pump() -> None:
            try:
                for value in fn(pipe, *args, **kwargs):
                    pipe.outbox.put(value)
            except BaseException as exc:  # noqa: BLE001 - the next recv raises it
                pipe.outbox.put(_Raised(exc))
            else:
                pipe.outbox.put(_END)

        here = contextvars.copy_context()  # the worker's: current_rank() in the generator
        thread = threading.Thread(target=here.run, args=(pump,), name=f"pipe {self.key}")
        thread.daemon = True
        thread.start()


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Recv:
    """The generator's next value on this proc."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.__qualname__ = "Pipe.recv"

    def __call__(self) -> Any:
        pipe = _pipes[self.key]
        try:
            value = pipe.outbox.get(timeout=RECV_WAIT)
        except queue.Empty:
            raise TimeoutError(f"the pipe's generator gave nothing in {RECV_WAIT:.0f} s") from None
        if value is _END:
            pipe.outbox.put(_END)  # every later recv fails alike
            raise EOFError("the pipe's generator ended")
        if isinstance(value, _Raised):
            pipe.outbox.put(value)
            raise value.error
        return value


class _Send:
    """Hand a value to this proc's generator."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.__qualname__ = "Pipe.send"

    def __call__(self, obj: Any) -> None:
        _pipes[self.key].inbox.put(obj)


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def create_pipe(fn: Any, *args: Any, max_messages: int = 50, **kwargs: Any) -> Pipe:
    """A ``Pipe`` to ``fn(pipe, *args, **kwargs)`` on every proc of the active mesh."""
    return Pipe(fn, max_messages, args, kwargs)


def remote_generator(
    fn: str | Callable[..., Any], max_messages: int = 50
) -> Callable[[Callable[..., Any]], Callable[..., Pipe]]:
    """``@remote_generator("module.generator")`` (or a function) over a ``propagate``
    generator: calling the decorated name makes a ``Pipe`` of ``fn`` with those arguments."""

    def wrapper(annotation: Callable[..., Any]) -> Callable[..., Pipe]:
        on_mesh = remote(fn, propagate=annotation)
        return lambda *args, **kwargs: create_pipe(
            on_mesh, *args, max_messages=max_messages, **kwargs
        )

    return wrapper
