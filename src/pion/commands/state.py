"""What every handler is handed: the worker's shared state, the calling client, and the
command table that dispatches (the row type, :class:`Command`, lives here too).

One :class:`ServerState` per worker process. It is a plain synchronous data structure
owned by the event loop thread: handlers mutate it without awaiting, so nobody sees it
half-updated.

A handler is a plain synchronous function ``handler(ctx, args) -> Reply``. ``args`` are
the command's arguments *without* its name. A handler validates everything before it
changes any state, and reports failures by raising a :class:`pion.errors.PionError`;
the dispatcher turns those into RESP errors. A handler whose payload is large may
return a :data:`~pion.commands.deferred.Deferred` instead of a reply, to have the
number conversion run off the event loop (``deferred.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pion.attend import AttentionTables
from pion.commands.budget import MemoryBudget, anon_bytes
from pion.commands.deferred import Deferred
from pion.commands.stats import CommandStats
from pion.config import ServerConfig
from pion.export.cache import ExportCache
from pion.keyspace import Keyspace
from pion.keyspace.databases import Databases
from pion.prefix.receipt import Receipt
from pion.prefix.registry import PrefixRegistry
from pion.pubsub import PubSub
from pion.resp.reply import Reply
from pion.ssm import SsmStore
from pion.vstore import VStore
from pion.watch import WatchToken

if TYPE_CHECKING:  # imported only where --tier is given (it pulls in redis-py)
    from pion.scripting.runtime import Scripts
    from pion.tier import Tier

__all__ = [
    "ClientState",
    "Command",
    "CommandTable",
    "Context",
    "Durability",
    "Handler",
    "ServerCounters",
    "ServerState",
]


class Durability(Protocol):
    """What the server and the commands need from the persistence layer (WAL and
    snapshots). ``pion.persistence`` implements it; ``None`` in ServerState means the
    server runs without a data directory."""

    def write_refusal(self) -> str | None:
        """None while writes are accepted, else the MISCONF message (after a failed
        write or fsync, until a write succeeds again)."""

    def needs_sync(self) -> bool:
        """True when replies must wait for :meth:`sync` (appendfsync always with
        records appended since the last fsync)."""

    def sync(self) -> None:
        """fsync what was appended; raises on failure (the caller withholds replies)."""

    def commit(self) -> None:
        """KV.PREFIX.COMMIT: return once everything acknowledged is on stable storage;
        PionError under --no-wal, MisconfError while the log is failing."""

    def close(self) -> None:
        """Flush and fsync the log and release files (graceful shutdown)."""

    def save(self, path: str | None = None) -> None:
        """Write an atomic snapshot (KV.PREFIX.SAVE, SHUTDOWN SAVE)."""

    def begin_unit(self) -> None:
        """EXEC starts: the records of the mutations until :meth:`end_unit` are kept
        and written as one log record (``pion.persistence.wal``)."""

    def end_unit(self) -> None:
        """EXEC ends: write the unit's records as one; raises MisconfError when the
        log cannot take it (the log is then failed: memory holds the changes)."""

    def info(self) -> dict[str, int | str]:
        """Fields of INFO's Persistence section and the wal_* fields of
        KV.PREFIX.INFO (``wal_enabled``, ``wal_bytes``, ``wal_appended``,
        ``wal_replayed``)."""


@dataclass
class ServerCounters:
    """INFO Stats counters."""

    total_connections_received: int = 0
    total_commands_processed: int = 0
    rejected_connections: int = 0
    protocol_errors: int = 0
    internal_errors: int = 0
    evicted_clients: int = 0  # disconnected by the maxmemory-clients bound
    # Commands whose number conversion ran on a worker thread (pion.commands.deferred).
    offloaded_commands: int = 0
    # Connections lost to a socket error, and replies that could not be written.
    io_errors: int = 0
    # Times a connection stopped for the turn, its slice of the loop used up.
    slices_yielded: int = 0

    def reset(self) -> None:
        self.total_connections_received = 0
        self.total_commands_processed = 0
        self.rejected_connections = 0
        self.protocol_errors = 0
        self.internal_errors = 0
        self.evicted_clients = 0
        self.offloaded_commands = 0
        self.io_errors = 0
        self.slices_yielded = 0


@dataclass
class ServerState:
    config: ServerConfig
    vstore: VStore
    receipt: Receipt
    persistence: Durability | None = None
    started: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    counters: ServerCounters = field(default_factory=ServerCounters)
    # INFO commandstats/errorstats and the slow log (stats.py).
    stats: CommandStats = field(default_factory=CommandStats)
    # Connected clients by id; the server adds and removes them, CLIENT LIST/KILL read.
    clients: dict[int, ClientState] = field(default_factory=dict)
    # Set while recovery replays the WAL: commands without the `loading` flag answer
    # -LOADING.
    loading: bool = False
    # Installed by the server: request a shutdown (save: bool).
    request_shutdown: Callable[[bool], None] | None = None
    # Installed by the server: close the connection of client id.
    kill_client: Callable[[int], bool] | None = None
    # Installed by the server: bytes all clients' query and reply buffers hold now.
    client_memory: Callable[[], int] | None = None
    # V.EXPORT's files (None: --no-export, or a state built without them).
    exports: ExportCache | None = None
    # The shared second tier (--tier), started after recovery; None without one.
    tier: Tier | None = None
    # Lua scripting's cache and state (pion.scripting), built by the first script.
    scripts: Scripts | None = None
    # True while EXEC or a script writes its log records as one unit.
    in_unit: bool = False
    # The plain keyspace's numbered databases (SELECT), beside the V-store, and the
    # one the command running now acts on: the dispatcher points it at the client's
    # selected database before each handler (``execution.call``), so a handler reads
    # ``state.keyspace`` and never asks which database it is in.
    databases: Databases = field(init=False)
    keyspace: Keyspace = field(init=False)
    # Pub/sub's subscriptions and output limits (pion.pubsub), and the enabled
    # keyspace notifications (pion.notify: notify-keyspace-events).
    pubsub: PubSub = field(default_factory=PubSub)
    notify_flags: int = 0
    # Every handler is counted and timed by a wrapper (pion.server.metrics,
    # --metrics-port): runs of plain commands (pion.commands.plain), which call no
    # handler, are then not made.
    metered: bool = False
    # Built from vstore and receipt: the KV.PREFIX registry over them.
    registry: PrefixRegistry = field(init=False)
    # Built from config: the attention tier's slot tables and the SSM state blobs.
    attention: AttentionTables = field(init=False)
    ssm: SsmStore = field(init=False)
    # used_memory, the --maxmemory check on it and maxmemory-policy (budget.py).
    memory: MemoryBudget = field(init=False)

    def __post_init__(self) -> None:
        self.registry = PrefixRegistry(self.vstore, self.receipt)
        cfg = self.config
        self.attention = AttentionTables(
            cfg.attend_warm_slots, cfg.attend_cold_slots, cfg.attend_maxmemory
        )
        self.ssm = SsmStore(cfg.ssm_maxmemory)
        self.databases = databases = Databases(cfg.databases)
        self.keyspace = databases[0]
        # One --maxmemory on used_memory for every store, its startup part measured
        # here, before recovery loads anything; a write that does not fit evicts
        # V-store namespaces, then keys of any database by maxmemory-policy (budget.py).
        self.memory = MemoryBudget(
            self.vstore,
            databases,
            self.attention,
            self.ssm,
            startup=anon_bytes(),
            policy=cfg.maxmemory_policy,
        )
        databases.set_budget(self.vstore.make_room)

    def uptime(self) -> int:
        return int(time.monotonic() - self.started_monotonic)


@dataclass
class ClientState:
    """Per-connection state the commands may read or change."""

    id: int
    addr: str = ""
    laddr: str = ""
    proto: int = 2
    authenticated: bool = False
    db: int = 0  # the selected database (SELECT)
    name: str = ""
    lib_name: str = ""
    lib_ver: str = ""
    created: float = 0.0
    last_command: str = ""
    closing: bool = False  # set by QUIT / CLIENT KILL: close after the reply
    no_evict: bool = False  # CLIENT NO-EVICT ON: exempt from maxmemory-clients
    # MULTI .. EXEC (pion.commands.transactions): the queued commands while a
    # transaction is open (None otherwise), whether queuing one failed (EXEC then
    # aborts), and this client's WATCH token (None while it watches nothing).
    queued: list[tuple[Command, Sequence[bytes]]] | None = None
    queue_failed: bool = False
    queued_bytes: int = 0  # the queued commands' argument bytes (bounded)
    watch: WatchToken | None = None
    # CLIENT REPLY: "on", "off", or "skip" (the next command's reply is dropped).
    reply_mode: str = "on"
    # Installed by the connection: append bytes to this client's output at once (a
    # pub/sub message or keyspace notification; pion.pubsub). None where there is no
    # RESP connection to push to.
    push: Callable[[bytes], None] | None = None


@dataclass(frozen=True)
class Command:
    """One row of the command table.

    ``arity`` follows Redis: it counts the command name; a positive number is an exact
    count, a negative one a minimum (``-2`` = the name and at least one argument).
    Flags: ``write`` (changes state; refused while persistence is failing),
    ``readonly``, ``admin``, ``noauth`` (allowed before AUTH), ``loading`` (allowed
    while recovery runs), ``fast``.
    """

    name: str
    handler: Handler
    arity: int
    flags: frozenset[str] = field(default_factory=frozenset)
    summary: str = ""

    def arity_ok(self, nargs: int) -> bool:
        """``nargs`` excludes the command name."""
        total = nargs + 1
        return total == self.arity if self.arity >= 0 else total >= -self.arity


# The table that dispatches: upper-case name -> row. Built once and frozen
# (``pion.commands.build_table``); COMMAND describes this same object.
CommandTable = Mapping[str, Command]


@dataclass
class Context:
    """What a handler sees: the server's shared state, the calling client and the
    command table it was dispatched from. ``may_wait``: the command may wait for data
    on its way (:class:`~pion.errors.NotYet`) instead of blocking the loop for it:
    True on a live connection, False where nothing may run in between (EXEC)."""

    state: ServerState
    client: ClientState
    table: CommandTable
    may_wait: bool = False


Handler = Callable[[Context, Sequence[bytes]], Reply | Deferred]
