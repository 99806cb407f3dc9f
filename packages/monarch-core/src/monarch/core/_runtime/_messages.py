"""The messages procs exchange: an ``Envelope``, a msgspec body, then pickled parts.

Frame layout: ``[Envelope, body, pickle, *out-of-band buffers]``; a small message (its
payload one small pickle, or none) is one part instead, a ``Packed``: encoded in one
call and decoded in one, with no frame parts to cut apart; those queued for one peer
together travel as one ``Batch``. The Envelope's ``kind`` says who receives it (an
actor mailbox, a port, or the proc itself) and ``dest`` names it; the body is one of
the Structs below. A connection opens with a ``Hello`` and its listener answers with
``Beat`` frames only (see ``_runtime``). The transport only carries frames: this schema
is the core's own. Same versioning rules as ``monarch.transport.wire`` (Structs only
grow at their end, with defaults), relaxed to one release: both ends of a job run the
same code, so a field no longer used is dropped. Same ``gc=False`` (no Struct here can
be part of a reference cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from monarch.core._layout._shape import NDSlice, Shape

TO_ACTOR: Final = 1
TO_PORT: Final = 2
TO_PROC: Final = 3


class Envelope(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The header of every message: part 0 of its frame (or the head of a ``Packed``);
    the payload (a pickle and its out-of-band buffers) follows as separate parts, so
    large buffers are never joined into one."""

    kind: int
    """Who receives it: ``TO_ACTOR``, ``TO_PORT`` or ``TO_PROC``."""
    dest: str
    """The mailbox (actor or port) the message is for."""
    sender: str
    """The sending proc's address, for replies, ordering and error reports."""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Extension point for metadata that needs no schema change (tracing, ...)."""


class Hello(msgspec.Struct, array_like=True, tag=24, frozen=True, gc=False):
    """The first frame on a connection a peer opens to us: who it is and what it wants
    of the connection (see ``PeerWriter.run``)."""

    sender: str
    incarnation: str = ""
    """The process's identity: outlives an address change, and tells a restarted process
    from its predecessor."""
    heartbeat_interval: float = 0.0
    """Seconds between the ``Beat`` frames the peer asks us to send back on this
    connection; 0: none (a peer on this machine sees us die by the connection closing)."""
    lane: bool = False
    """The connection is the peer's lane to us (values for our inboxes, see ``_flow``)."""
    pid: int = 0
    probe: int = 0
    """Where in process ``pid`` a peer of its machine reads ``incarnation`` to find out it
    may read its memory (``_lending``); 0: it cannot be read."""
    service: str = ""
    """A service of our runtime the connection is for (``Runtime.services``: the
    debugger's sessions), not a peer's messages."""


class Beat(msgspec.Struct, array_like=True, tag=25, frozen=True, gc=False):
    """All a listener sends back on a peer's connection: the answer to its ``Hello``
    (with our ``incarnation``), heartbeats, and a held lane's notice."""

    incarnation: str = ""
    pull: bool = False
    """We can read the peer's memory: it may lend us its large buffers (``_lending``)."""
    consumed: bool = False
    """The peer's held lane to us: our inboxes consume (see ``_flow``)."""


class PortRef(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Where replies go: a port of a proc. Values for an ``inbox`` (a ``Channel``'s
    port, whose consumer may be slower than its senders) travel on the proc's lane
    (see ``_runtime._flow``)."""

    proc: str
    port: int
    inbox: bool = False


class ShapeSpec(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A shape on the wire: labels over a strided region of ranks."""

    labels: tuple[str, ...]
    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]


def shape_spec(shape: Shape) -> ShapeSpec:
    s = shape.ndslice
    return ShapeSpec(tuple(shape.labels), s.offset, tuple(s.sizes), tuple(s.strides))


def shape_of(spec: ShapeSpec) -> Shape:
    return Shape(list(spec.labels), NDSlice(spec.offset, list(spec.sizes), list(spec.strides)))


class Call(msgspec.Struct, array_like=True, tag=1, frozen=True, gc=False):
    """Run an endpoint on the actor(s) of a mesh living in the receiving proc."""

    mesh: str
    method: str
    shape: ShapeSpec
    """The (sliced) shape the message was cast to; gives each actor its message rank."""
    reply: PortRef | None = None
    explicit: bool = False
    """The method takes the reply port as its first argument (``as_endpoint`` calls)."""
    origin: str = ""
    """The process that cast it; the Envelope's sender may be a relay of the cast tree."""
    seqs: tuple[int, ...] = ()
    """The receiver's sequence number from ``origin`` for this mesh (restores FIFO), then
    those of the procs in ``forward``, in order."""
    forward: tuple[str, ...] = ()
    """The procs below the receiver in the cast tree, in cast order: it relays to them."""
    gather: bool = False
    """The reply port gathers one value per rank: a proc hosting several of the targets
    may answer for all of them in one PortBatch."""
    trace: str = ""
    """What the caller's instrumentation gave the call (a trace context, see _instrument)."""
    tree: bool = False
    """Replies are gathered up the cast tree (``gather`` and not streamed): each relay
    sends its subtree's up as one PortBatch (see ``_combine``)."""


STOP_METHOD: Final = "__monarch_stop__"
"""A Call with this method stops the actor, in order after every earlier message."""


class PortValue(msgspec.Struct, array_like=True, tag=2, frozen=True, gc=False):
    """A value (or, with ``error``, an exception) sent to a port by a rank."""

    rank: int
    error: bool = False


class PortBatch(msgspec.Struct, array_like=True, tag=3, frozen=True, gc=False):
    """Values for several ranks at once: per group, its ranks, whether it is an error, and
    how many payload parts (which follow, group after group) its one pickled value has."""

    groups: tuple[tuple[tuple[int, ...], bool, int], ...]
    lost: tuple[tuple[str, str], ...] = ()
    """Procs a relay of the cast tree saw fail with their subtree's replies still to come,
    each with what the relay was told (see ``_combine``)."""


class SpawnActor(msgspec.Struct, array_like=True, tag=10, frozen=True, gc=False):
    """Create an actor in the receiving proc; the pickle holds (class, args, kwargs)."""

    mesh: str
    name: str
    rank: int
    """Global rank of this actor in its mesh."""
    shape: ShapeSpec
    reply: PortRef
    ranks: tuple[int, ...] = ()
    """All the ranks of the mesh this process hosts (procs sharing a process), if several."""
    owner: str = "<root>"
    """The spawning actor's name in supervision texts (see ``_reports``)."""
    ack: PortRef | None = None
    """Where the actors' ``__init__`` outcomes go when not to ``reply``: the port of the
    host agent that relayed the spawn (``Relay``), which sends them on together."""

    def for_ranks(self, ranks: Sequence[int], ack: PortRef | None = None) -> SpawnActor:
        """This spawn for the process that hosts ``ranks`` of the mesh (sent by the spawner
        itself, or by the procs' agent with its ``ack``)."""
        several = tuple(ranks) if len(ranks) > 1 else ()
        return msgspec.structs.replace(self, rank=ranks[0], ranks=several, ack=ack or self.ack)


class ProcReady(msgspec.Struct, array_like=True, tag=12, frozen=True, gc=False):
    """A new proc tells its spawner where it listens; and its host agent too, when the
    agent watches it for the spawner (see ``_host._watching``)."""

    address: str
    pid: int
    rank: int = 0


class StopProc(msgspec.Struct, array_like=True, tag=13, frozen=True, gc=False):
    reason: str


class Launch(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """How a host agent starts one proc (upstream's ``BootstrapCommand`` and ``proc_bind``):
    ``program`` "" is the agent's own way (its Python, ``-m monarch.core._host._proc``)."""

    program: str = ""
    arg0: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str | None] = msgspec.field(default_factory=dict)
    """Set over the environment (``None``: removed from it)."""
    inherit_env: bool = True
    """Whether the proc starts from the agent's environment (else from an empty one)."""
    bind: dict[str, str] = msgspec.field(default_factory=dict)
    """CPU/NUMA binding: ``cpus``/``physcpubind`` (a CPU list), ``cpunodebind``, ``membind``."""


class SpawnProcs(msgspec.Struct, array_like=True, tag=14, frozen=True, gc=False):
    """Ask a host agent to start ``count`` procs, ranks ``base_rank`` onwards.

    Each proc reports ``ProcReady`` to ``ready``; the agent reports each exit as
    ``ProcExited`` to ``events`` (it is the first to know: it is the parent).
    """

    count: int
    base_rank: int
    ready: PortRef
    events: PortRef
    name: str = "procs"
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """Environment for the procs: the spawner's configuration."""
    python: str = ""
    """The Python to run the procs with ("" = the agent's own)."""
    root: str = ""
    """The job's root client, which the procs report to for ``get_or_spawn_controller``
    ("" = the agent's own root)."""
    launches: tuple[Launch, ...] = ()
    """How to start each of the ``count`` procs (none: each the default way)."""
    forward_output: bool = False
    """Read the procs' stdout and stderr (passing them on to the agent's own) and send
    them to ``events`` as ``LogLines`` (``enable_log_forwarding``; the agent also reads
    them for ``tail_log_lines`` and ``enable_file_capture``, see ``_logs``)."""


class ProcExited(msgspec.Struct, array_like=True, tag=15, frozen=True, gc=False):
    rank: int
    pid: int
    how: str
    """"exited with code N" or "was killed by signal N"."""
    tail: tuple[str, ...] = ()
    """The last lines the proc wrote to stderr (``tail_log_lines`` of them, read by its
    agent: upstream's ``stderr_tail``)."""


class ProcLost(msgspec.Struct, array_like=True, tag=39, frozen=True, gc=False):
    """A host agent's word to a proc's spawner: the proc, still running, went silent past
    the heartbeat deadline (frozen); the spawner writes it off (``_host._watching``)."""

    rank: int
    pid: int
    reason: str
    """The agent's ``PeerLost`` ("ADDRESS sent no heartbeat for ...")."""


class Relay(msgspec.Struct, array_like=True, tag=40, frozen=True, gc=False):
    """Ask a host agent to pass ``body`` on to its procs at ``procs`` (``_host._watching``):
    a spawner that has the agent watch those procs sends one message per host, not one per
    proc, and needs no connection to each of them (issue 34). For a ``SpawnActor``,
    ``ranks`` holds each proc's ranks, and the agent gathers their ``__init__`` outcomes
    and sends them on to ``body.reply`` as one ``PortBatch``."""

    procs: tuple[str, ...]
    body: SpawnActor | StopProc
    ranks: tuple[tuple[int, ...], ...] = ()


class SpawnFailed(msgspec.Struct, array_like=True, tag=16, frozen=True, gc=False):
    """A host agent could not start a proc."""

    rank: int
    reason: str


class RunBootstrap(msgspec.Struct, array_like=True, tag=17, frozen=True, gc=False):
    """Run the pickled callable on the proc before anything else; reply to ``reply``."""

    reply: PortRef


class GetController(msgspec.Struct, array_like=True, tag=18, frozen=True, gc=False):
    """Ask the root client for its singleton actor ``name``, spawning it (from the
    pickled class and arguments) on first request; the reply is the pickled mesh."""

    name: str
    reply: PortRef


class ActorFailed(msgspec.Struct, array_like=True, tag=19, frozen=True, gc=False):
    """An actor has failed: sent to the process that spawned it, where its owner lives."""

    mesh: str
    rank: int
    reason: str
    """The supervision event (``MeshFailure.event``)."""
    report: str = ""
    """``MeshFailure.report()``: the failure at the bottom of the chain."""


class ReturnLoans(msgspec.Struct, array_like=True, tag=20, frozen=True, gc=False):
    """The borrower has read these lent buffers (see ``_lending``): the lender may let go."""

    keys: tuple[int, ...]


class KillProcs(msgspec.Struct, array_like=True, tag=23, frozen=True, gc=False):
    """Ask a host agent to kill these procs of its own (those that did not stop when asked:
    frozen, or stuck in native code); each exit is reported as usual, ``ProcExited``."""

    pids: tuple[int, ...]
    reason: str


class ProcsOf(msgspec.Struct, array_like=True, tag=31, frozen=True, gc=False):
    """Ask the process that spawned a proc mesh for its procs' addresses, once they run
    (a mesh sent while its procs were starting, see ``_pending``); the reply is the list."""

    token: str
    reply: PortRef


class HowEnded(msgspec.Struct, array_like=True, tag=32, frozen=True, gc=False):
    """Ask the process that spawned a proc how it ended (its host agent told that process,
    ``ProcExited``); the reply is a ``ProcExited`` whose ``how`` is "" if it does not know."""

    address: str
    reply: PortRef


class LogLines(msgspec.Struct, array_like=True, tag=33, frozen=True, gc=False):
    """Whole lines a proc wrote, from its host agent to its spawner (see ``_logs``)."""

    rank: int
    stream: int
    """1: stdout, 2: stderr."""
    text: str
    """One or more lines, without the last newline."""
    host: str = ""
    """The agent's host name."""


class SetLogLevel(msgspec.Struct, array_like=True, tag=34, frozen=True, gc=False):
    """Set the root Python logger's level of a proc (``ProcMesh.logging_option``)."""

    level: int


class AskService(msgspec.Struct, array_like=True, tag=42, frozen=True, gc=False):
    """A request to one of a proc's ``Service``s (see ``_ask``): its name, the request
    (msgpack of a Struct of the service's union) and where the answer goes."""

    service: str
    request: bytes
    reply: PortRef


class ActorState(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One actor of a proc, as its runner sees it."""

    actor_id: str
    mesh: str
    """The name the mesh was spawned with."""
    class_name: str
    rank: int
    point: str
    """Its coordinates in its mesh (``{'gpus': 0/2}``)."""
    state: str
    """``starting``, ``running``, ``stopped`` or ``failed``."""
    error: str = ""
    """Why it failed (the supervision report), or why it stopped."""
    handled: int = 0
    """Messages it has begun to handle."""
    queued: int = 0
    """Messages waiting for it."""
    current: str = ""
    """The endpoint it runs now ("" when idle)."""
    busy_for: float = 0.0
    """Seconds it has been in ``current``."""
    idle_for: float = -1.0
    """Seconds since its last message began (-1: none yet)."""
    thread: int = 0
    """The thread that runs its code (``ThreadStack.ident``): an ``async def`` actor's own
    (it runs its event loop); for a sync actor the pool thread handling its messages now,
    0 while it has none (see ``_runner._pool``)."""


class StackFrame(msgspec.Struct, array_like=True, frozen=True, gc=False):
    filename: str
    lineno: int
    function: str
    line: str = ""


class ThreadStack(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A thread's Python stack, outermost frame first."""

    name: str
    ident: int
    frames: list[StackFrame]
    daemon: bool = False


class ProcSnapshot(msgspec.Struct, array_like=True, tag=41, frozen=True, gc=False):
    """What a proc says of itself when asked (``Introspect``)."""

    address: str
    pid: int
    hostname: str
    cpu_user: float
    """Seconds of CPU this process has used, in user mode and in the kernel."""
    cpu_system: float
    rss: int
    """Resident memory, bytes."""
    threads: int
    actors: list[ActorState]
    stacks: list[ThreadStack] = msgspec.field(default_factory=list)
    uptime: float = 0.0
    """Seconds since the process started."""
    children: int = 0
    """Procs this process started (as a host agent) that still run."""


Body = (
    Call
    | PortValue
    | PortBatch
    | SpawnActor
    | ProcReady
    | StopProc
    | SpawnProcs
    | ProcExited
    | ProcLost
    | Relay
    | SpawnFailed
    | RunBootstrap
    | GetController
    | ActorFailed
    | ReturnLoans
    | KillProcs
    | ProcsOf
    | HowEnded
    | LogLines
    | SetLogLevel
    | ProcSnapshot
    | AskService
)


class Packed(msgspec.Struct, array_like=True, tag=21, frozen=True, gc=False):
    """A whole small message as one frame part (see the module docstring)."""

    envelope: Envelope
    body: Body
    payload: tuple[bytes, ...] = ()


PACK_MAX: Final = 4096
"""A payload of one pickle up to this size travels in a ``Packed``."""


class Batch(msgspec.Struct, array_like=True, tag=22, frozen=True, gc=False):
    """``Packed`` messages queued for one peer together, in order, as one frame part:
    a burst costs the receiver one frame and one decode, not one per message."""

    items: list[Packed]


BATCH_MAX: Final = 256
"""At most this many messages in a ``Batch``..."""
BATCH_BYTES: Final = 64 * 1024
"""...and payloads of about this many bytes in all (a frame the reader takes in one read)."""

_decoder: Final = msgspec.msgpack.Decoder(Body)
_single_decoder: Final = msgspec.msgpack.Decoder(Packed | Batch | Hello)
_envelope_decoder: Final = msgspec.msgpack.Decoder(Envelope)
_beat_decoder: Final = msgspec.msgpack.Decoder(Beat)
_encoder: Final = msgspec.msgpack.Encoder()

encode: Final = _encoder.encode
"""Any Struct of this module (an envelope, a body, a hello, a beat) as msgpack."""
encode_body = encode
decode_envelope: Final = _envelope_decoder.decode
decode_beat: Final = _beat_decoder.decode


decode_body: Final = _decoder.decode
decode_single: Final = _single_decoder.decode
"""A one-part frame from a peer: a ``Packed`` message, a ``Batch`` of them, or its
``Hello``."""


# -- the debugger's sessions (a service connection to the root, see ``_debugger``) --------


class DebugStart(msgspec.Struct, array_like=True, tag=60, frozen=True, gc=False):
    """A breakpoint was hit: the session of ``actor_name`` (its mesh's name) at ``rank``."""

    actor_name: str
    rank: int
    coords: dict[str, int]
    hostname: str
    pid: int
    function: str = ""
    """Where the actor stopped (``module.function``) and the line."""
    lineno: int = 0


class DebugWrite(msgspec.Struct, array_like=True, tag=61, frozen=True, gc=False):
    """What the debugger printed, and where the paused frame is."""

    text: str
    function: str = ""
    lineno: int = 0


class DebugRead(msgspec.Struct, array_like=True, tag=62, frozen=True, gc=False):
    """The debugger waits for a line of input."""


class DebugEnd(msgspec.Struct, array_like=True, tag=63, frozen=True, gc=False):
    """The actor runs on: the session is over (a later breakpoint starts another)."""


class DebugInput(msgspec.Struct, array_like=True, tag=64, frozen=True, gc=False):
    """A line for the debugger (root to proc)."""

    line: str


class DebugSource(msgspec.Struct, array_like=True, tag=65, frozen=True, gc=False):
    """The debugger asks the root for the source of ``filename``, which the proc cannot
    read (code of the client's script or notebook cell, pickled by value)."""

    filename: str


class DebugLines(msgspec.Struct, array_like=True, tag=66, frozen=True, gc=False):
    """The root's lines of ``filename`` (none where it has none either)."""

    filename: str
    lines: list[str]


DebugMessage = (
    DebugStart | DebugWrite | DebugRead | DebugEnd | DebugInput | DebugSource | DebugLines
)
decode_debug: Final = msgspec.msgpack.Decoder(DebugMessage).decode


# -- a host agent's zygote (a forking server of procs, see ``_zygote``) -------------------


class ZygoteFork(msgspec.Struct, array_like=True, tag=70, frozen=True, gc=False):
    """Fork a proc: its environment and directory; its stdin, stdout and stderr come with
    the request (three descriptors). With ``main``, the child runs that module with those
    arguments (as ``python -m``), not a proc: a job's forker of workers (monarch-jobs)."""

    token: int
    env: dict[str, str]
    cwd: str
    main: tuple[str, ...] = ()


class ZygoteForked(msgspec.Struct, array_like=True, tag=71, frozen=True, gc=False):
    """The proc of request ``token`` runs as ``pid`` (0: it could not, ``error`` says why)."""

    token: int
    pid: int
    error: str = ""


class ZygoteExited(msgspec.Struct, array_like=True, tag=72, frozen=True, gc=False):
    """A proc ended: ``code`` as ``Popen.returncode`` has it (negative: killed by a signal)."""

    pid: int
    code: int


class ZygoteReady(msgspec.Struct, array_like=True, tag=73, frozen=True, gc=False):
    """From a zygote's successor (``_zygote_proc``) to the zygote that forked it: it has
    imported what it was to preload and takes the requests from now on; or, with
    ``error``, it cannot serve (a preloaded module started a thread) and exits."""

    error: str = ""


class ZygotePreload(msgspec.Struct, array_like=True, tag=74, frozen=True, gc=False):
    """From a zygote to its successor that is still preloading: import these too before
    you say you are ready (requests asked for more than it was started for)."""

    names: tuple[str, ...]


ZygoteMessage = ZygoteFork | ZygoteForked | ZygoteExited | ZygoteReady | ZygotePreload
decode_zygote: Final = msgspec.msgpack.Decoder(ZygoteMessage).decode
