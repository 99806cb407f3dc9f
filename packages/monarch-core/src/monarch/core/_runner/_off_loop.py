"""An async actor's ``__init__`` on a thread of its own, seeing the actor's loop as running.

Upstream runs each async actor on a loop of its own, so its ``__init__`` may block on a
Future (``get_or_spawn_controller(...).get()``, a call to another actor) as well as start
tasks. Here async actors share the proc's loop, which must keep serving while ``__init__``
waits: so ``__init__`` runs on a thread, where ``asyncio.get_running_loop()`` is a
``LoopProxy`` that does what it is asked on the actor's loop, thread-safely. Tasks that
``__init__`` starts (``asyncio.create_task``) then run on that loop, beside the endpoints.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any

_DIRECT = frozenset({"time", "get_debug", "is_running", "is_closed", "_thread_id"})
"""What the proxy reads from the loop directly: cheap and safe from any thread."""


class LoopProxy:
    """The running loop of a thread that is not the loop's: every call goes to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _on_loop(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` run on the loop; its result (the loop is free meanwhile)."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result()

    def create_task(
        self,
        coro: Coroutine[Any, Any, Any],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        """A task of the loop, in the caller's context (the actor's, in ``__init__``)."""
        context = context if context is not None else contextvars.copy_context()
        task: asyncio.Task[Any] = self._on_loop(
            self._loop.create_task, coro, name=name, context=context
        )
        return task

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._loop, name)
        if name in _DIRECT or not callable(attribute):
            return attribute
        return functools.partial(self._on_loop, attribute)


async def construct_off_loop(
    loop: asyncio.AbstractEventLoop,
    context: contextvars.Context,
    cls: type,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``cls(*args, **kwargs)`` in ``context`` on a new thread (see the module's docstring)."""
    made: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if made.done():
            return
        if exc is None:
            made.set_result(value)
        else:
            made.set_exception(exc)

    def construct() -> None:
        asyncio.events._set_running_loop(LoopProxy(loop))  # type: ignore[arg-type]
        try:
            instance = context.run(cls, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the actor fails with it
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, instance, None)
        finally:
            asyncio.events._set_running_loop(None)

    threading.Thread(target=construct, name=f"init-{cls.__name__}", daemon=True).start()
    return await made
