"""Every configuration key, as one field of the frozen ``Config`` snapshot, and its coercion.

A field's annotation is the key's type, which msgspec checks strictly (no ``"5"`` for an int),
with the bounds of its ``msgspec.Meta``; its ``key(...)`` default gives the default, environment
variables and doc. A ``Spelling`` in the annotation adds what people write that msgspec cannot
know (``"30s"``, ``"64MiB"``, ``"json"``, a ``ChannelTransport``), read before msgspec checks.

A key's value has four forms: *layer* (what the layers store: durations as integer nanoseconds, so
nothing drifts), *public* (``get_global_config``, as upstream: durations as normalised humantime,
``"300s"`` reads back ``"5m"``), *snapshot* (``Config`` attributes: durations as float seconds,
cheapest on hot paths) and *text* (environment variables, for child processes).
"""

# ruff: noqa: RUF009 -- ``key()`` returns a dataclasses.field, which ruff cannot tell
# No ``from __future__ import annotations`` here: ``Config``'s annotations are evaluated
# once, as the class is made, instead of as 63 strings that ``dataclass`` inspects and
# ``get_type_hints`` compiles one by one (most of what importing this module cost, in every
# process that imports the core: a zygote before its first proc).

import dataclasses
import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Final

from ._key import (
    _META,
    DURATION,
    ENCODING,
    EVENT_LOOP,
    Byte,
    Bytes,
    Count,
    Encoding,
    Float32,
    Key,
    Nanoseconds,
    Positive,
    Seconds,
    Spelling,
    Transport,
    key,
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Frozen, attribute-access view of the merged configuration (see ``current_config``).

    Durations are float seconds, sizes int bytes. Keys marked "ours" are not upstream's. A new
    key is one field here; its default is written as this class holds it (``30.0``, not "30s").
    """

    # transport and wire
    default_transport: Transport = key(
        "unix",
        "HYPERACTOR_MESH_DEFAULT_TRANSPORT",
        "HYPERACTOR_DEFAULT_TRANSPORT",
        "MONARCH_TRANSPORT",
        doc="Channel transport for procs' addresses (enable_transport).",
    )
    codec_max_frame_length: Bytes = key(
        10 * 1024**3,
        "HYPERACTOR_CODEC_MAX_FRAME_LENGTH",
        doc="Largest message sent, in bytes; a call or reply larger fails (SupervisionError).",
        upstream="hyperactor::config::codec_max_frame_length",
    )
    default_encoding: Annotated[Encoding, ENCODING] = key(
        Encoding.Multipart,
        "HYPERACTOR_DEFAULT_ENCODING",
        doc="Wire encoding of message bodies.",
        upstream="wirevalue::config::default_encoding",
        shows="repr",
    )
    small_write_threshold: Bytes = key(
        256,
        "MONARCH_HYPERACTOR_SMALL_WRITE_THRESHOLD",
        doc="A Buffer copies writes under this many bytes; it keeps larger bytes as references.",
        upstream="monarch_hyperactor::buffers::small_write_threshold",
    )
    # messages
    message_delivery_timeout: Seconds = key(
        30.0,
        "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
        doc="A message not delivered within this is returned as undeliverable.",
        upstream="hyperactor::config::message_delivery_timeout",
        shows="repr",
    )
    message_ack_time_interval: Seconds = key(
        0.5,
        "HYPERACTOR_MESSAGE_ACK_TIME_INTERVAL",
        doc="Channel acknowledgement period.",
        upstream="hyperactor::config::message_ack_time_interval",
        shows="repr",
    )
    message_ack_every_n_messages: Count = key(
        1000,
        "HYPERACTOR_MESSAGE_ACK_EVERY_N_MESSAGES",
        doc="Acknowledge at least every N messages.",
        upstream="hyperactor::config::message_ack_every_n_messages",
    )
    message_ttl_default: Byte = key(
        64,
        "HYPERACTOR_MESSAGE_TTL_DEFAULT",
        doc="Hops a message may take before it is dropped as looping.",
        upstream="hyperactor::config::message_ttl_default",
    )
    split_max_buffer_size: Count = key(
        5,
        "HYPERACTOR_SPLIT_MAX_BUFFER_SIZE",
        doc="Fragments buffered while splitting/reassembling messages.",
        upstream="hyperactor::config::split_max_buffer_size",
    )
    split_max_buffer_age: Seconds = key(
        0.05,
        "HYPERACTOR_SPLIT_MAX_BUFFER_AGE",
        doc="Longest a split-message buffer waits before it is flushed.",
        upstream="hyperactor::config::split_max_buffer_age",
        shows="repr",
    )
    channel_net_rx_buffer_full_check_interval: Seconds = key(
        5.0,
        "HYPERACTOR_CHANNEL_NET_RX_BUFFER_FULL_CHECK_INTERVAL",
        doc="How often a full receive buffer is re-checked.",
        upstream="hyperactor::config::channel_net_rx_buffer_full_check_interval",
        shows="repr",
    )
    message_latency_sampling_rate: Float32 = key(
        0.009999999776482582,  # 0.01 as the 32-bit float upstream holds
        "HYPERACTOR_MESSAGE_LATENCY_SAMPLING_RATE",
        doc="Fraction of messages whose latency is recorded.",
        upstream="hyperactor::config::message_latency_sampling_rate",
    )
    enable_dest_actor_reordering_buffer: bool = key(
        True,
        "HYPERACTOR_ENABLE_DEST_ACTOR_REORDERING_BUFFER",
        doc="Restore per-sender order at the destination actor.",
        upstream="hyperactor::config::enable_dest_actor_reordering_buffer",
    )
    actor_queue_dispatch: bool = key(
        True,
        "HYPERACTOR_ACTOR_QUEUE_DISPATCH",
        doc="Dispatch actor messages through a queue rather than directly.",
    )
    # casting
    max_cast_dimension_size: Count = key(
        16,
        "HYPERACTOR_MESH_MAX_CAST_DIMENSION_SIZE",
        doc="Largest mesh dimension a cast covers in one step of the tree.",
        upstream="hyperactor_mesh::config::max_cast_dimension_size",
    )
    max_cast_fanout: Positive = key(
        16,
        "HYPERACTOR_MESH_MAX_CAST_FANOUT",
        doc="Children per node of the multicast forwarding tree.",
        upstream="hyperactor_mesh::config::max_cast_fanout",
        shows="repr",
    )
    # spawning, stopping, supervision
    host_spawn_ready_timeout: Seconds = key(
        30.0,
        "HYPERACTOR_HOST_SPAWN_READY_TIMEOUT",
        doc="Longest wait for a spawned host to become ready.",
        upstream="hyperactor::config::host_spawn_ready_timeout",
        shows="repr",
    )
    mesh_proc_spawn_max_idle: Seconds = key(
        30.0,
        "HYPERACTOR_MESH_PROC_SPAWN_MAX_IDLE",
        doc="Longest silence between status updates while spawning procs.",
        upstream="hyperactor_mesh::host_mesh::proc_spawn_max_idle",
        shows="repr",
    )
    actor_spawn_max_idle: Seconds = key(
        30.0,
        "HYPERACTOR_MESH_ACTOR_SPAWN_MAX_IDLE",
        doc="Longest silence between status updates while spawning actors.",
        upstream="hyperactor_mesh::proc_mesh::actor_spawn_max_idle",
        shows="repr",
    )
    get_actor_state_max_idle: Seconds = key(
        30.0,
        "HYPERACTOR_MESH_GET_ACTOR_STATE_MAX_IDLE",
        doc="Longest wait for an actor state query.",
        upstream="hyperactor_mesh::proc_mesh::get_actor_state_max_idle",
        shows="repr",
    )
    proc_stop_max_idle: Seconds = key(
        30.0,
        "HYPERACTOR_MESH_PROC_STOP_MAX_IDLE",
        doc="Longest silence between status updates while stopping procs.",
        upstream="hyperactor_mesh::host_mesh::proc_stop_max_idle",
        shows="repr",
    )
    get_proc_state_max_idle: Seconds = key(
        60.0,
        "HYPERACTOR_MESH_GET_PROC_STATE_MAX_IDLE",
        doc="Longest wait for a proc state query.",
        upstream="hyperactor_mesh::host_mesh::get_proc_state_max_idle",
        shows="repr",
    )
    stop_actor_timeout: Seconds = key(
        10.0,
        "HYPERACTOR_STOP_ACTOR_TIMEOUT",
        doc="Budget for an actor to stop gracefully.",
        upstream="hyperactor::config::stop_actor_timeout",
        shows="repr",
    )
    cleanup_timeout: Seconds = key(
        3.0,
        "HYPERACTOR_CLEANUP_TIMEOUT",
        doc="Budget for an actor's __cleanup__.",
        upstream="hyperactor::config::cleanup_timeout",
        shows="repr",
    )
    process_exit_timeout: Seconds = key(
        10.0,
        "HYPERACTOR_PROCESS_EXIT_TIMEOUT",
        doc="Wait for a process to exit before it is killed.",
        upstream="hyperactor::config::process_exit_timeout",
        shows="repr",
    )
    mesh_terminate_timeout: Seconds = key(
        10.0,
        "HYPERACTOR_MESH_TERMINATE_TIMEOUT",
        doc="Per-child budget for graceful termination.",
        upstream="hyperactor_mesh::bootstrap::mesh_terminate_timeout",
        shows="repr",
    )
    mesh_terminate_concurrency: Count = key(
        16,
        "HYPERACTOR_MESH_TERMINATE_CONCURRENCY",
        doc="Children terminated at once during shutdown.",
        upstream="hyperactor_mesh::bootstrap::mesh_terminate_concurrency",
    )
    supervision_watchdog_timeout: Seconds = key(
        120.0,
        "HYPERACTOR_MESH_SUPERVISION_WATCHDOG_TIMEOUT",
        doc="Silence on the supervision stream after which the controller counts as unreachable.",
        upstream="hyperactor_mesh::actor_mesh::supervision_watchdog_timeout",
        shows="repr",
    )
    mesh_attach_config_timeout: Seconds = key(
        60.0,
        "HYPERACTOR_MESH_ATTACH_CONFIG_TIMEOUT",
        doc="Budget for pushing configuration to workers in attach_to_workers.",
        upstream="hyperactor_mesh::config::mesh_attach_config_timeout",
        shows="repr",
    )
    mesh_bootstrap_enable_pdeathsig: bool = key(
        True,
        "HYPERACTOR_MESH_BOOTSTRAP_ENABLE_PDEATHSIG",
        doc="Children get a parent-death signal, so none outlives its parent.",
        upstream="hyperactor_mesh::bootstrap::mesh_bootstrap_enable_pdeathsig",
    )
    heartbeat_interval: Seconds = key(
        1.0,
        "MONARCH_HEARTBEAT_INTERVAL",
        doc="(ours) Period of host/proc liveness heartbeats.",
        ours=True,
    )
    heartbeat_timeout: Seconds = key(
        5.0,
        "MONARCH_HEARTBEAT_TIMEOUT",
        doc="(ours) A peer silent this long is declared dead.",
        ours=True,
    )
    transport_handshake_timeout: Seconds = key(
        10.0,
        "MONARCH_TRANSPORT_HANDSHAKE_TIMEOUT",
        doc=(
            "(ours) Seconds a peer may take to complete the job's authenticated handshake "
            "(TLS included) before the connection is closed; a machine busy starting a "
            "thousand procs may need more."
        ),
        ours=True,
    )
    fork_procs: bool = key(
        True,
        "MONARCH_FORK_PROCS",
        doc=(
            "(ours) A host agent forks its procs from a zygote that has imported what a "
            "proc runs (a few ms each), instead of starting each as a new Python (~0.25 s "
            "of CPU); procs with another program, Python or numactl start as new ones."
        ),
        ours=True,
    )
    prestart_zygote: bool = key(
        True,
        "MONARCH_PRESTART_ZYGOTE",
        doc=(
            "(ours) A script's zygote starts as it imports monarch.actor, so that its "
            "first procs are forks of a zygote that imported beside the script (read from "
            "the environment at that import; with fork_procs)."
        ),
        ours=True,
    )
    proc_preload: str = key(
        "auto",
        "MONARCH_PROC_PRELOAD",
        doc=(
            "(ours) Modules a host's zygote imports for its procs, so that each proc "
            "has them without importing them itself (comma-separated; empty: none). "
            "'auto': torch and monarch.tensor, those the spawner has imported. Procs "
            "asked for while the zygote imports them are forked without them (they "
            "import them when they need them). A script's zygote, started as it imports "
            "monarch.actor, starts on those the script imported before at once (read from "
            "the environment then)."
        ),
        ours=True,
    )
    read_peer_buffers: bool = key(
        True,
        "MONARCH_READ_PEER_BUFFERS",
        doc=(
            "(ours) Processes of one machine read each other's large buffers directly "
            "(process_vm_readv, one copy) where allowed, instead of through the socket."
        ),
        ours=True,
    )
    wait_spin: Seconds = key(
        300e-6,
        "MONARCH_WAIT_SPIN",
        doc=(
            "(ours) How long a waiting thread yields the CPU before it sleeps: replies and "
            "calls that come sooner skip a wake-up. A process's event loop after it handled "
            "messages, an idle thread of the sync actors' pool (one per process), and a "
            "thread blocking on a Future when fewer processes must answer than there are "
            "CPUs (else it would take a CPU they need). 0 to sleep at once. Unless set, a "
            "host agent that runs more than 8 procs per CPU starts them with it off (their "
            "spins would take CPUs the others need)."
        ),
        ours=True,
    )
    loop_follows_waiter: bool = key(
        True,
        "MONARCH_LOOP_FOLLOWS_WAITER",
        doc=(
            "(ours) While waiters yield (wait_spin), a process's event loop moves to the CPU "
            "of the thread that waits for it (pinned there; the threads and processes it "
            "starts, and user code that runs on it, are not) and no longer yields after "
            "messages itself: the two then hand the work over on one CPU (a round trip "
            "~3x faster on a 2-CPU VM). Off: the scheduler places the loop, as it does every "
            "other thread (for a process whose threads' CPUs the user sets)."
        ),
        ours=True,
    )
    sync_actor_threads: Count = key(
        16,
        "MONARCH_SYNC_ACTOR_THREADS",
        doc=(
            "(ours) The first this many sync actors of a process each have a thread of their "
            "own, as upstream (thread-local state kept from one message to the next); the "
            "sync actors beyond them share one pool of at most this many threads, started as "
            "needed. An actor's messages still run one at a time, in order; a thread asleep "
            "on a Future does not count. With this many endpoints of the shared pool blocked "
            "otherwise (a lock, a socket, sleep), its other actors wait, and a message there "
            "may run on another thread than the previous one. 0: a thread per sync actor, "
            "however many, as upstream."
        ),
        ours=True,
    )
    event_loop: Annotated[str, EVENT_LOOP] = key(
        "auto",
        "MONARCH_EVENT_LOOP",
        doc=(
            "(ours) The event loop of every runtime: 'uvloop', 'asyncio', or 'auto' (uvloop "
            "when installed). Read when a process starts its runtime."
        ),
        ours=True,
    )
    procs_per_process: Positive = key(
        1,
        "MONARCH_PROCS_PER_PROCESS",
        doc=(
            "(ours) Procs of a spawn_procs mesh that share one OS process: simulates a large "
            "mesh (e.g. 8 x 128) on a small machine; each proc still gets its own actors."
        ),
        ours=True,
    )
    enable_telemetry: bool = key(
        False,
        "MONARCH_ENABLE_TELEMETRY",
        doc=(
            "(ours) Procs load the monarch.instrumentation plug-ins (monarch-telemetry's "
            "spans and metrics). Set by the client's plug-in; procs inherit it."
        ),
        ours=True,
    )
    telemetry_sink: str = key(
        "",
        "MONARCH_TELEMETRY_SINK",
        doc=(
            "(ours) Where procs' instrumentation sends its telemetry rows (ADDRESS#PORT: a "
            "port of the client's job telemetry store, set by monarch-telemetry)."
        ),
        ours=True,
    )
    # logging
    enable_log_forwarding: bool = key(
        False,
        "HYPERACTOR_MESH_ENABLE_LOG_FORWARDING",
        doc="Forward children's stdout/stderr through the mesh.",
        upstream="hyperactor_mesh::bootstrap::mesh_enable_log_forwarding",
    )
    enable_file_capture: bool = key(
        False,
        "HYPERACTOR_MESH_ENABLE_FILE_CAPTURE",
        doc="Persist children's output to per-host files.",
        upstream="hyperactor_mesh::bootstrap::mesh_enable_file_capture",
    )
    tail_log_lines: Count = key(
        0,
        "HYPERACTOR_MESH_TAIL_LOG_LINES",
        doc="Recent output lines kept in memory per process.",
        upstream="hyperactor_mesh::bootstrap::mesh_tail_log_lines",
    )
    read_log_buffer: Count = key(
        100,
        "HYPERACTOR_READ_LOG_BUFFER",
        doc="Buffer size used when reading children's logs.",
        upstream="hyperactor_mesh::logging::read_log_buffer",
    )
    prefix_python_logs_with_actor: bool = key(
        True,
        "MONARCH_PREFIX_PYTHON_LOGS_WITH_ACTOR",
        doc=(
            "(ours as a key: upstream's is an attribute of its private config module) "
            "Python log records emitted in an actor's code, through a handler, start with "
            "[actor=<its name>]."
        ),
        ours=True,
    )
    force_file_log: bool = key(
        False,
        "HYPERACTOR_FORCE_FILE_LOG",
        doc="Log to a file regardless of the environment.",
        upstream="hyperactor_mesh::logging::force_file_log",
    )
    prefix_with_rank: bool = key(
        True,
        "HYPERACTOR_PREFIX_WITH_RANK",
        doc="Prefix forwarded log lines with the rank.",
        upstream="hyperactor_mesh::logging::prefix_with_rank",
    )
    # admin
    mesh_admin_addr: str = key(
        "[::]:1729",
        "HYPERACTOR_MESH_ADMIN_ADDR",
        doc="Bind address of the mesh admin HTTP server.",
        upstream="hyperactor_mesh::config::mesh_admin_addr",
        shows="repr",
    )
    pyspy_bin: str = key(
        "",
        "PYSPY_BIN",
        doc="py-spy executable used by the admin server ('' = look it up on PATH).",
        upstream="hyperactor_mesh::config::pyspy_bin",
    )
    # rdma
    rdma_allow_tcp_fallback: bool = key(
        True,
        "MONARCH_RDMA_ALLOW_TCP_FALLBACK",
        doc="Without ibverbs, move RDMA buffers over TCP/shared memory instead of failing.",
        upstream="monarch_rdma::config::rdma_allow_tcp_fallback",
    )
    rdma_tcp_integrity: bool = key(
        True,
        "MONARCH_RDMA_TCP_INTEGRITY",
        doc=(
            "(ours) The TCP plane tags the bytes it moves, so that a machine on the path "
            "cannot change them unseen (requests are tagged either way). False, on both "
            "ends, leaves the bytes untagged: for networks trusted as the machines are."
        ),
        ours=True,
    )
    rdma_disable_ibverbs: bool = key(
        False,
        "MONARCH_RDMA_DISABLE_IBVERBS",
        doc="Ignore ibverbs devices even when present (forces the fallback).",
        upstream="monarch_rdma::config::rdma_disable_ibverbs",
    )
    rdma_max_chunk_size_mb: Count = key(
        64,
        "MONARCH_RDMA_MAX_CHUNK_SIZE_MB",
        doc="Chunk size, in MiB, of fallback transfers.",
        upstream="monarch_rdma::config::rdma_max_chunk_size_mb",
    )
    rdma_ibverbs_target: str = key(
        "",
        "MONARCH_RDMA_IBVERBS_TARGET",
        doc="Device to use: 'cpu:<numa>', 'gpu:<ordinal>', 'nic:<name>' ('' = automatic).",
        upstream="monarch_rdma::config::rdma_ibverbs_target",
    )
    rdma_peer_device_affinity: str = key(
        "",
        "MONARCH_RDMA_PEER_DEVICE_AFFINITY",
        doc="Which peer NICs a local NIC pairs with: 'any', 'match_name', 'groups:a,b|c,d'.",
        upstream="monarch_rdma::config::rdma_peer_device_affinity",
    )
    rdma_max_nics_per_buffer: Positive | None = key(
        None,
        "MONARCH_RDMA_MAX_NICS_PER_BUFFER",
        doc="NICs a buffer is registered on, at most (None = every equally good NIC).",
        upstream="monarch_rdma::config::rdma_max_nics_per_buffer",
        shows="repr",
    )
    rdma_min_stripe_size_kb: Positive = key(
        512,
        "MONARCH_RDMA_MIN_STRIPE_SIZE_KB",
        doc="Smallest stripe, in KiB, when a transfer is striped across queue pairs.",
        upstream="monarch_rdma::config::rdma_min_stripe_size_kb",
        shows="repr",
    )
    rdma_qps_per_cq: Positive = key(
        64,
        "MONARCH_RDMA_QPS_PER_CQ",
        doc="Queue pairs sharing one completion queue.",
        upstream="monarch_rdma::config::rdma_qps_per_cq",
        shows="repr",
    )
    rdma_cq_poller_per_device: bool = key(
        True,
        "MONARCH_RDMA_CQ_POLLER_PER_DEVICE",
        doc="One completion poller per device instead of one per completion queue.",
        upstream="monarch_rdma::config::rdma_cq_poller_per_device",
    )
    rdma_runtime_worker_threads: Count = key(
        4,
        "MONARCH_RDMA_RUNTIME_WORKER_THREADS",
        doc="Worker threads of the RDMA data plane (latched at first RDMA use).",
        upstream="monarch_rdma::config::rdma_runtime_worker_threads",
    )


def _build_key(field: dataclasses.Field[Any], annotation: Any) -> Key:
    env, doc, ours, upstream, shows = field.metadata[_META]
    spelling = next(
        (m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Spelling)), None
    )
    layer_type = Nanoseconds if spelling is DURATION else annotation
    probe = Key(field.name, layer_type, spelling, None, env, doc, ours, upstream, shows)
    default = probe.coerce(field.default)
    held = probe.snapshot(default)
    if held != field.default or type(held) is not type(field.default):
        raise TypeError(f"Config.{field.name}: write its default as {held!r}, as Config holds it")
    return Key(field.name, layer_type, spelling, default, env, doc, ours, upstream, shows)


def _build_keys() -> dict[str, Key]:
    hints = typing.get_type_hints(Config, include_extras=True)
    return {f.name: _build_key(f, hints[f.name]) for f in dataclasses.fields(Config)}


KEYS: Final[Mapping[str, Key]] = MappingProxyType(_build_keys())
"""Every configuration key, by name, in declaration order."""
