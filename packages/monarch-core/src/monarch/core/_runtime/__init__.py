"""The per-process runtime: one event loop, a listener, a writer per peer, ports, actors.

Every Monarch process runs exactly one ``Runtime``, on one asyncio event loop (uvloop when
installed): in a worker proc on its main thread, in the controller (the user's script) and
in a ``monarch worker`` on a background thread, so plain code can block on futures while
the loop works. The core's hot paths use asyncio directly: the loop's callbacks, not
anyio's task groups, carry every message (anyio serves the transports, and awaiting a
Monarch Future from trio).

Which thread does what:

- **The loop thread** owns all routing state: ports, watchers, actor sinks, the writer
  tasks, timers. Code elsewhere reaches it through ``Runtime.call_soon(fn, *args)``, one
  ordered queue for every thread, so what a thread asks for happens in the order it asked.
- **Any thread may send** (``Runtime.post``/``cast``/``send_to_port``): a message to an
  idle peer is written by the sending thread itself, else queued to that peer's writer
  (``_peers``); one thread's messages to one peer keep their order either way. A thread
  may cast without the loop only when ``Runtime.idle()`` (nothing it asked earlier is
  still queued).
- **An actor** runs off the loop and replies from there: a sync actor's code on a thread
  of the process's bounded pool, an async actor's on an event loop of its own, on its
  thread (``monarch.core._runner``); only the runtime's own work runs on the runtime loop.
- **The heartbeat thread** (``_beats``) beats to the peers on other machines that asked,
  whatever the loop is doing: a loop busy for seconds (an import) is no death. Reading a
  spawn (which may import the actor's module) and a bootstrap function also happen off
  the loop.
- **Waiting**: every waiter (a thread blocked on a Future, an idle actor thread, the loop
  after messages) first yields the CPU for ``wait_spin``, then sleeps (``_spin``).

Modules: ``_spin`` (the wait rule), ``_loop`` (the event loop), ``_flow`` (fair turns and
backpressure), ``_beats`` (heartbeats), ``_peers`` (a peer's writer), ``_router``
(``Runtime``), ``_current`` (this process's runtime).
"""

from ._current import (
    current_runtime,
    install_runtime,
    on_loop_thread,
    running_runtime,
    set_starter,
)
from ._flow import CONSUMER_TURN, MESSAGE_COST, Flow, suspend_senders
from ._loop import new_event_loop
from ._peers import DEFER, PeerWriter, dial
from ._router import ActorSink, ControlHandler, PeerWatcher, PortHandler, Runtime, Service
from ._spin import USABLE_CPUS, spin, spin_seconds

__all__ = [
    "CONSUMER_TURN",
    "DEFER",
    "MESSAGE_COST",
    "USABLE_CPUS",
    "ActorSink",
    "ControlHandler",
    "Flow",
    "PeerWatcher",
    "PeerWriter",
    "PortHandler",
    "Runtime",
    "Service",
    "current_runtime",
    "dial",
    "install_runtime",
    "new_event_loop",
    "on_loop_thread",
    "running_runtime",
    "set_starter",
    "spin",
    "spin_seconds",
    "suspend_senders",
]
