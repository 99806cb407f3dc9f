"""Joining workers on other machines (``attach_to_workers``) and choosing the transport.

A worker (``monarch worker``, ``run_worker_loop_forever``) is a host agent listening on the
network; ``attach_to_workers`` makes a HostMesh of such agents. Procs started there reply
straight to the controller, so the controller must listen where the workers can reach it:
on TCP, at its address on the route to the workers. If the controller's runtime is not yet
running it starts there; if it already runs (on Unix sockets, or on TCP at another
address), it also listens there and becomes known by that address: what was sent to its
old address still arrives, as that listener stays open.

A controller the workers cannot reach (nor it them) attaches through a gateway that both
can reach (``attach("gateway://HOST:PORT")``, ``monarch gateway``): it is then known at
that gateway and reaches the workers through it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Literal

from monarch.core._config import BindSpec, configure, current_config
from monarch.core._layout._shape import NDSlice, Shape
from monarch.core._mesh._exits import worker_stopping, workers_stopping
from monarch.core._mesh._future import run_on
from monarch.core._mesh._proc_mesh import HostMesh
from monarch.core._runtime import Runtime, current_runtime, dial, running_runtime
from monarch.core._runtime._netaddr import WILDCARD_HOSTS, route_source, split_alias
from monarch.core._runtime._peers import peer_options
from monarch.core._runtime._tls import CA, PrivateKey
from monarch.transport import (
    Address,
    AuthenticationError,
    ConnectError,
    HandshakeError,
    TransportError,
    open_listener,
)

from ._environ import ROOT_ENV, SECRET_ENV
from ._worker import secure

log = logging.getLogger("monarch.core")


class ChannelTransport(enum.Enum):
    """Upstream's transports, for ``enable_transport`` (mapped by name onto ours, see _config:
    the Tls/Quic kinds become ``tls``, TcpWithLocalhost ``tcp://127.0.0.1:0``, Local ``unix``).

    Every member upstream has, with its ``int()``; ``MetaTlsWithIpAddr`` is an older name of ours.
    """

    TcpWithLocalhost = 0
    TcpWithHostname = 1
    MetaTlsWithHostname = 2
    MetaTlsWithIpV6 = 3
    MetaTlsWithIpAddr = 3  # noqa: PIE796 - an alias, on purpose
    Tls = 4
    Quic = 5
    MetaQuicWithHostname = 6
    MetaQuicWithIpV6 = 7
    Local = 8
    Unix = 9

    def get(self) -> ChannelTransport:
        """This transport (upstream's method of the same name)."""
        return self

    def __int__(self) -> int:
        return int(self.value)

    def __repr__(self) -> str:
        return f"ChannelTransport.{self.name}"


_SHORTCUTS: dict[str, ChannelTransport] = {
    "tcp": ChannelTransport.TcpWithHostname,
    "ipc": ChannelTransport.Unix,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
    "tls": ChannelTransport.Tls,
}
"""``enable_transport``'s words for ChannelTransport members (upstream's; configure takes none
of ``ipc``, ``metatls``, ``metatls-hostname``)."""


def _bind_spec(transport: object) -> BindSpec:
    if transport is None:
        raise TypeError("enable_transport needs a transport, not None")
    if isinstance(transport, str):
        transport = _SHORTCUTS.get(transport, transport)
    return BindSpec(transport)


def enable_transport(transport: ChannelTransport | str | Any) -> None:
    """Choose the transport procs listen on: ``"unix"``/``"ipc"``, ``"tcp"``, ``"tls"``,
    ``"tcp://host:port"``, or a ``ChannelTransport``.

    Call it before the first Monarch use in this process: it sets the ``default_transport``
    configuration key, which the runtime reads when it starts. Afterwards it raises
    RuntimeError, unless the runtime already uses that very transport.
    """
    spec = _bind_spec(transport)
    canonical = spec.transport
    runtime = running_runtime()
    if runtime is None:
        configure(default_transport=spec)
        return
    scheme = Address.parse(runtime.address).scheme
    running = {"unix": "unix", "tcp": "tcp", "tls": "tls"}.get(scheme, scheme)
    same = canonical in (current_config().default_transport, running, runtime.address)
    if canonical == "local":  # upstream's in-process channel: we use Unix sockets for it
        same = same or running == "unix"
    if not same:
        raise RuntimeError(
            f"enable_transport({transport!r}) after Monarch started in this process with "
            f"{running!r} (at {runtime.address}); call it before the first use of Monarch"
        )


def _resolve(worker: object) -> str:
    if isinstance(worker, str):
        return worker
    if isinstance(worker, concurrent.futures.Future):
        value = worker.result()
    elif callable(getattr(worker, "get", None)):  # monarch.actor.Future
        value = worker.get()  # type: ignore[attr-defined]
    else:
        raise TypeError(f"a worker is an address str or a Future of one, not {worker!r}")
    if not isinstance(value, str):
        raise TypeError(f"a worker Future gave {value!r}, not an address str")
    return value


def _dial_address(url: str) -> str:
    """Where to reach the worker named by ``url`` (an address, or ``ADVERTISED@BIND``)."""
    address = Address.parse(split_alias(url)[0])
    if address.scheme not in ("tcp", "tls", "unix"):
        raise ValueError(
            f"worker address {url!r}: only tcp://, tls:// (or unix:// on this host) works"
        )
    if address.host in WILDCARD_HOSTS or address.port == 0:
        raise ValueError(
            f"worker address {url!r} is a listen pattern; give the address the worker printed"
        )
    return str(address)


def _reachable_runtime(workers: Sequence[str]) -> Runtime:
    """The controller's runtime, listening where ``workers`` can reach it (through its
    gateway, if attached through one)."""
    running = running_runtime()
    if running is not None and running.via is not None:
        return running
    network = [a for a in map(Address.parse, workers) if a.scheme != "unix"]
    if not network:
        return current_runtime()
    first = network[0]
    assert first.port is not None
    if any(a.scheme != first.scheme for a in network):
        raise ValueError("attach_to_workers: workers are all tcp:// or all tls://, not both")
    try:
        source = route_source(first.host, first.port)
    except OSError as exc:
        raise ConnectionError(f"no route to worker {first}: {exc}") from None
    runtime = current_runtime(listen=str(Address(first.scheme, source, 0)))
    identity = Address.parse(runtime.address)
    if identity.scheme != first.scheme or identity.host != source:
        run_on(runtime, _listen_at(runtime, first.scheme, source)).get()
    return runtime


async def _listen_at(runtime: Runtime, scheme: str, host: str) -> None:
    """Make ``runtime`` reachable at ``host`` over ``scheme``, and known by that address:
    procs on the workers connect back to it (over TLS too, when the workers use it)."""
    listener = runtime.listener
    bound = listener.address if listener is not None else None
    if bound is not None and bound.scheme == scheme and bound.host in WILDCARD_HOSTS:
        address = Address(scheme, host, bound.port)  # that listener serves every interface
    else:
        url = str(Address(scheme, host, 0))
        extra = await open_listener(url, secret=runtime.secret, **peer_options(url, server=True))
        runtime.spawn_task(extra.serve(runtime._serve_connection))
        address = extra.address
    log.info("controller %s is now known as %s, for remote workers", runtime.address, address)
    if runtime.root in ("", runtime.address):  # this client is the job's root: procs on
        runtime.root = str(address)  # the workers find it there (get_or_spawn_controller)
        os.environ[ROOT_ENV] = runtime.root
    runtime.address = str(address)


def _watch_worker(runtime: Runtime, address: str) -> None:
    workers_stopping([address], False)  # attached (again): its end would be news

    def lost(address: str, exc: BaseException) -> None:
        if worker_stopping(address):
            log.info("worker %s ended as asked: %s", address, exc)
            return
        hint = ""
        if isinstance(exc, AuthenticationError):
            hint = f" (the worker must be given this controller's {SECRET_ENV})"
        log.warning("worker %s failed: %s%s", address, exc, hint)

    runtime.forget(address)  # attaching again means: a new worker may be there now
    runtime.watch_peer(address, lost)


ATTACH_FAILED = "attach failed: config push failed during attach"
"""Upstream's words for workers not reached within ``mesh_attach_config_timeout``."""

_FIRST_RETRY = 0.05
_LAST_RETRY = 1.0
"""Seconds between tries to reach a worker: doubling from the first to the last."""


def _not_there_yet(exc: BaseException) -> bool:
    """Whether a failed dial may be a worker still starting (nothing listens yet, or it
    has not accepted yet), rather than one that answered and refused us."""
    if isinstance(exc, ConnectError):
        return True
    if type(exc) is not HandshakeError:  # AuthenticationError, ProtocolVersionError
        return False
    ssl = sys.modules.get("ssl")  # loaded only by the tls transport
    return ssl is None or not isinstance(exc.__cause__, ssl.SSLError)


async def _reach(runtime: Runtime, address: str, deadline: float) -> BaseException | None:
    """Dial ``address`` until a worker answers there, backing off, until ``deadline``
    (loop time): None once one answers (a refusal included: the worker's watch reports
    it), else the last reason it could not be reached."""
    loop = runtime.loop
    delay = _FIRST_RETRY
    last: BaseException = TimeoutError("no answer")
    while True:
        try:
            conn = await asyncio.wait_for(dial(runtime, address), deadline - loop.time())
        except TimeoutError:
            return last
        except (TransportError, OSError) as exc:
            if not _not_there_yet(exc):
                return None
            last = exc
            left = deadline - loop.time()
            if left <= 0:
                return exc
            log.debug("worker %s not reachable yet (%s); trying again", address, exc)
            await asyncio.sleep(min(delay, left))
            delay = min(2 * delay, _LAST_RETRY)
        else:
            await conn.aclose()
            return None


async def _attach_all(runtime: Runtime, addresses: list[str]) -> Literal[True]:
    """Wait for every worker to answer (a worker launched a moment before the attach may
    still be starting, as batch schedulers start them), then watch each: upstream's
    config push, which fails closed naming the hosts it could not reach."""
    budget = current_config().mesh_attach_config_timeout
    deadline = runtime.loop.time() + budget
    unique = list(dict.fromkeys(addresses))
    reasons = await asyncio.gather(*(_reach(runtime, a, deadline) for a in unique))
    failed = [(a, r) for a, r in zip(unique, reasons, strict=True) if r is not None]
    for address in unique:
        if all(address != a for a, _ in failed):
            _watch_worker(runtime, address)
    if failed:
        lines = "".join(
            f"\n  - {address}: not reachable within mesh_attach_config_timeout ({budget:g}s): "
            f"{reason}"
            for address, reason in failed
        )
        raise RuntimeError(f"{ATTACH_FAILED} on {len(failed)} host(s):{lines}")
    return True


_attached: list[str] = []
"""The address ``attach`` was given (once)."""


def attach(addr: str) -> None:
    """Bootstrap this process's client toward ``addr`` (upstream's, for a client outside
    the network of its procs): call it before the first ``context()``, ``this_host()`` or
    ``this_proc()``; the same ``addr`` again does nothing.

    ``gateway://HOST:PORT`` (what ``monarch gateway`` prints) routes the client through
    that gateway: it connects to every worker and proc through it, and they reach it there
    (see ``_gateway``). Any other address is a worker's: the client then listens on its
    route to that worker, which procs must be able to reach. Raises RuntimeError, in
    upstream's words, after a local start or another ``addr``.
    """
    if _attached:
        if _attached[0] == addr:
            return
        raise RuntimeError(
            f"client is already attached through {_attached[0]}, not {addr}; detaching is not "
            "supported, so use a new process to attach through a different address"
        )
    if running_runtime() is not None:
        raise RuntimeError(
            "client was initialized without a remote attachment; call attach(addr) before "
            "the first context()/this_host()/this_proc()"
        )
    if Address.parse(addr).scheme == "gateway":
        gateway = _gateway_address(addr)
        try:
            runtime = current_runtime(listen=gateway)  # registered there (our address)
        except (OSError, TransportError) as exc:
            raise ConnectionError(f"cannot attach through gateway {gateway}: {exc}") from exc
        runtime.via = gateway
        log.info("client attached through gateway %s as %s", gateway, runtime.address)
    else:
        _reachable_runtime([_dial_address(addr)])
    _attached.append(addr)


def _gateway_address(url: str) -> str:
    address = Address.parse(url)
    if "@" in address.host or not address.port:
        raise ValueError(f"attach({url!r}): a gateway's address is gateway://HOST:PORT")
    return str(address)


def attach_to_workers(
    *,
    workers: Sequence[str | Any],
    name: str | None = None,
    ca: CA = None,
    private_key: PrivateKey = None,
) -> HostMesh:
    """A HostMesh (extent ``{"hosts": len(workers)}``) of running workers.

    ``workers`` are the addresses the workers print (``tcp://host:port``), or Futures of
    them (resolved here). Workers must have been given this process's job secret
    (``MONARCH_JOB_SECRET``); a worker that cannot be reached or authenticated fails the
    procs spawned on it with a SupervisionError. ``tls://`` workers need ``ca=``: the CA
    certificate that signed theirs, with ``private_key=`` (PEM: this machine's key and a
    certificate that CA signed, which the workers check), or ``"trust_all_connections"``
    (see ``_tls``). ``name`` is accepted for upstream compatibility.

    Returns at once, as upstream's: workers that are still starting are tried again, with
    backoff, for ``mesh_attach_config_timeout``; procs are spawned once all answered. One
    that never does fails the mesh's ``initialized`` (and what is spawned on it) with
    RuntimeError "attach failed: config push failed during attach ...", naming it.
    """
    if isinstance(workers, str):
        raise TypeError("workers is a sequence of addresses, not one address")
    addresses = [_dial_address(_resolve(worker)) for worker in workers]
    secure(ca=ca, private_key=private_key, addresses=addresses)
    if not addresses:
        raise ValueError("attach_to_workers needs at least one worker")
    runtime = _reachable_runtime(addresses)
    attached = run_on(runtime, _attach_all(runtime, addresses))
    shape = Shape(["hosts"], NDSlice.new_row_major([len(addresses)]))
    return HostMesh(addresses, shape, runtime, owned=True, attached=attached)
