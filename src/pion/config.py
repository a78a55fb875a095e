"""Frozen configuration dataclasses for the server and its protocol limits.

Every limit the server enforces is a named field here with its provenance, so a test
or an operator can see and change it, and so it is checked before anything is
allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pion.codecs.base import MAX_DIM
from pion.resp.limits import MB, ProtocolLimits

__all__ = [
    "DEFAULT_EXPORT_DIR",
    "FLAG",
    "AppendFsync",
    "Flag",
    "ProtocolLimits",
    "ServerConfig",
    "TierConfig",
    "TierWrite",
    "VStoreLimits",
    "flag",
]

AppendFsync = Literal["always", "everysec", "no"]
TierWrite = Literal["sync", "async"]

# Pion's default export directory name ("./pion-export"); ours lives in the data
# directory unless --export-dir (or $PION_EXPORT_DIR) says otherwise.
DEFAULT_EXPORT_DIR = Path("pion-export")


@dataclass(frozen=True)
class VStoreLimits:
    """Per-command bounds of the V-store (docs/protocol.md, "Protocol limits")."""

    max_layers: int = 80  # layers 0..79, as in Pion
    max_rows: int = 200_000  # rows per layer
    max_dim: int = MAX_DIM  # what every codec supports
    max_schema_layers: int = 59  # Pion's RESP3 inline-array limit: 5 + N <= 64
    max_fetch_ids: int = 1024  # legacy V.FETCH id list


@dataclass(frozen=True)
class Flag:
    """How one config field is set on the command line. ``pion.cli`` builds every
    server option from these, so a flag's name, type, bounds, default and help are
    written once, beside the field they set.

    The option's type follows the field's annotation (int, float, str, Path, bool or a
    Literal of choices); ``lo``/``hi`` bound a number; ``memory`` takes a size such as
    ``8gb``; ``negate`` makes a boolean field's flag turn it off (``--no-wal``).
    """

    help: str
    name: str = ""  # default: "--" + the field's name with dashes
    short: str = ""
    lo: float | None = None
    hi: float | None = None
    memory: bool = False
    negate: bool = False
    choices: tuple[str, ...] = ()
    env: str = ""
    metavar: str = ""
    must_exist: bool = False  # a path option: the file must exist


FLAG = "flag"  # the metadata key of a field's Flag


def flag(**settings: Any) -> dict[str, Flag]:
    """A field's metadata naming its command-line flag: ``field(default=...,
    metadata=flag(help=...))``."""
    return {FLAG: Flag(**settings)}


@dataclass(frozen=True)
class TierConfig:
    """The shared second tier on a Valkey / Redis Cluster or one redis-server
    (``--tier``; see ``pion.tier`` and docs/tier.md)."""

    # redis://[user:password@]host:port[,host:port...] (rediss:// for TLS); parsed and
    # checked by pion.tier.url.parse_tier_url.
    url: str = field(
        metadata=flag(
            name="--tier",
            metavar="URL",
            help="Shared second tier: redis://host:port[,host:port...] (Redis Cluster, "
            "Valkey or one redis-server; rediss:// for TLS). See docs/tier.md.",
        )
    )
    # sync: a write's reply waits for the tier while it is reachable; async: it is
    # queued and written behind. Either way a tier that is down never fails a write.
    write: TierWrite = field(
        default="sync",
        metadata=flag(
            help="sync: a write's reply waits for the tier while it is up; async: queued."
        ),
    )
    username: str | None = field(
        default=None, metadata=flag(name="--tier-user", help="ACL user name for the tier.")
    )
    password: str | None = field(default=None, metadata=flag(help="Password for the tier."))
    tls: bool = field(default=False, metadata=flag(help="TLS to the tier (as rediss://)."))
    tls_ca_file: Path | None = field(
        default=None, metadata=flag(name="--tier-tls-ca", must_exist=True, help="CA bundle (PEM).")
    )
    tls_cert_file: Path | None = field(
        default=None,
        metadata=flag(name="--tier-tls-cert", must_exist=True, help="Client certificate."),
    )
    tls_key_file: Path | None = field(
        default=None, metadata=flag(name="--tier-tls-key", must_exist=True, help="Client key.")
    )
    # Every key starts with "<prefix>:v<format version>:", so several deployments (or
    # a future format) can share one cluster.
    prefix: str = field(
        default="pion",
        metadata=flag(help="Key prefix in the tier (deployments sharing a cluster use their own)."),
    )
    # Seconds one tier round trip may take (socket timeout). Reads block the worker's
    # loop while they wait, so this bounds how long a slow tier can stall it.
    timeout: float = field(
        default=2.0, metadata=flag(lo=0.01, hi=60, help="Seconds one tier round trip may take.")
    )
    # How long a sync write waits for the tier before its reply goes out anyway (the
    # write stays queued and is retried).
    sync_timeout: float = 5.0
    # Bound of the write-behind queue: copies of payloads waiting for the tier. Past it
    # a session is marked for a full resync instead of queueing more (pion.tier.writer).
    queue_max_bytes: int = field(
        default=256 << 20,
        metadata=flag(
            name="--tier-queue-max",
            memory=True,
            lo=1,
            help="Bytes of writes queued for the tier (e.g. 256mb).",
        ),
    )
    queue_max_ops: int = 65_536
    # How long shutdown waits for queued writes to reach the tier.
    drain_timeout: float = 5.0


@dataclass(frozen=True)
class ServerConfig:
    """Everything `pion-server` is started with. A field with a :class:`Flag` is a
    command-line option of ``pion-server`` (``pion.cli``); the others are set by code
    (a worker's id, the protocol limits) or by options ``pion.cli`` reads itself (the
    password's three sources, ``--tier``'s group)."""

    bind: str = field(
        default="127.0.0.1",
        metadata=flag(help="Address to listen on; non-loopback needs --requirepass."),
    )
    port: int = field(
        default=1974, metadata=flag(lo=0, hi=65535, help="RESP port (0 picks a free one).")
    )
    dir: Path = field(
        default_factory=lambda: Path("./data"),
        metadata=flag(help="Data directory (snapshots, write-ahead log)."),
    )
    # From --requirepass, --requirepass-file or $PION_REQUIREPASS (pion.cli).
    requirepass: str | None = None
    unsafe_no_auth: bool = field(
        default=False, metadata=flag(help="Allow a non-loopback bind without a password.")
    )
    vstore_max_sessions: int = field(
        default=256,
        metadata=flag(
            lo=1, hi=1_000_000, help="V-store sessions before LRU namespaces are evicted."
        ),
    )
    maxmemory: int = field(
        default=0,
        metadata=flag(
            memory=True,
            help="Bound on used_memory: startup memory, every store's data, client buffers "
            "(e.g. 8gb); 0 = none.",
        ),
    )
    # Redis's maxmemory-policy: what is evicted to stay under --maxmemory
    # (pion.commands.budget; the LFU pair is refused).
    maxmemory_policy: str = field(
        default="volatile-lru",
        metadata=flag(
            choices=(
                "noeviction",
                "volatile-lru",
                "allkeys-lru",
                "volatile-ttl",
                "volatile-random",
                "allkeys-random",
            ),
            help="What --maxmemory evicts: V-store namespaces, then keys (noeviction: nothing).",
        ),
    )
    log_level: str = field(
        default="info",
        metadata=flag(choices=("debug", "info", "notice", "warning", "error"), help="Log level."),
    )
    appendfsync: AppendFsync = field(
        default="everysec", metadata=flag(help="When the write-ahead log is fsynced.")
    )
    wal_enabled: bool = field(
        default=True,
        metadata=flag(name="--no-wal", negate=True, help="Disable the write-ahead log."),
    )
    save_interval: float = field(
        default=0.0, metadata=flag(lo=0, help="Seconds between automatic snapshots (0 = off).")
    )
    worker_id: int = 0
    # Redis's hll-sparse-max-bytes (default 3000): a sparse HyperLogLog that would grow
    # past it turns dense. Set by CONFIG SET only, as the byte layout depends on it.
    hll_sparse_max_bytes: int = 3000
    # -w N --independent-workers: N worker processes under a supervisor.
    workers: int = field(
        default=1, metadata=flag(short="-w", lo=1, hi=64, help="Worker processes.")
    )
    # TLS on the RESP ports and the binary lane: a PEM certificate chain and its key;
    # with tls_ca, clients must present a certificate signed by it.
    tls_cert: Path | None = field(
        default=None,
        metadata=flag(
            must_exist=True, help="PEM certificate chain: serve TLS on the RESP and affinity ports."
        ),
    )
    tls_key: Path | None = field(
        default=None, metadata=flag(must_exist=True, help="PEM private key of --tls-cert.")
    )
    tls_ca: Path | None = field(
        default=None,
        metadata=flag(
            must_exist=True, help="PEM CA bundle: require client certificates signed by it."
        ),
    )
    # Prometheus text format on this port (0 picks a free one); None = no endpoint.
    metrics_port: int | None = field(
        default=None,
        metadata=flag(
            lo=0, hi=65535, help="Serve Prometheus metrics on this port (0 picks a free one)."
        ),
    )
    # Attention tier (docs/attention.md). fa_window: the default sliding window of a query
    # that sends none (0 = full attention, N = the last N prefix tokens).
    fa_window: int = field(
        default=0,
        metadata=flag(
            lo=0,
            help="Attention queries' default sliding window: the last N prefix tokens "
            "(0 = full attention).",
        ),
    )
    # Redis's databases: how many numbered keyspaces SELECT, MOVE and SWAPDB choose
    # from (pion.keyspace.databases), all in one memory budget.
    databases: int = field(
        default=16,
        metadata=flag(
            lo=1, hi=1_000_000, help="Numbered databases SELECT chooses from (Redis's 16)."
        ),
    )
    # Redis's maxclients default. At startup the open-files limit is raised to fit it
    # (or it is lowered to fit the limit, with a warning), as Redis does, so the
    # descriptor limit is never what stops a connection: the next one is answered
    # "-ERR max number of clients reached" and closed.
    maxclients: int = field(
        default=10_000,
        metadata=flag(
            lo=1,
            hi=1_000_000,
            help="Connections served at once; the next is refused (Redis's default).",
        ),
    )
    # Bytes all clients' query and reply buffers may hold together (Redis 7's
    # maxmemory-clients, off by default there). Over it, the clients holding the most
    # are disconnected, largest first (Redis's client eviction). 2 GiB is twice the
    # largest single command the protocol limits admit (max_query_buffer, 1 GiB), so
    # one maximal upload never trips it. 0 = no bound.
    maxmemory_clients: int = field(
        default=2048 * MB,
        metadata=flag(
            memory=True,
            help="Bytes all client buffers may hold together before the largest holders "
            "are disconnected (0 = no bound).",
        ),
    )
    attend_warm_slots: int = field(
        default=256,
        metadata=flag(
            name="--attend-slots",
            lo=1,
            hi=1_000_000,
            help="WARM attention slots ((session, layer) K/V held for queries).",
        ),
    )
    attend_cold_slots: int = field(
        default=1024,
        metadata=flag(
            lo=0,
            hi=10_000_000,
            help="COLD registry entries (demoted slots KV.PREFIX.WARM can bring back).",
        ),
    )
    attend_maxmemory: int = field(
        default=0,
        metadata=flag(
            memory=True, help="Byte budget for K/V in WARM attention slots (e.g. 4gb); 0 = none."
        ),
    )
    ssm_maxmemory: int = field(
        default=0,
        metadata=flag(memory=True, help="Byte budget for SSM.PREFIX state blobs; 0 = none."),
    )
    # The binary lane (docs/attention.md): None = the RESP port + 1, as Pion's client assumes.
    binary_lane: bool = field(
        default=True,
        metadata=flag(name="--no-binary-lane", negate=True, help="Do not open the binary lane."),
    )
    binary_port: int | None = field(
        default=None,
        metadata=flag(lo=0, hi=65535, help="Port of the binary lane (default: the RESP port + 1)."),
    )
    protocol: ProtocolLimits = field(default_factory=ProtocolLimits)
    vstore: VStoreLimits = field(default_factory=VStoreLimits)
    tier: TierConfig | None = None  # None: no shared second tier (the --tier-* options)
    # V.EXPORT (docs/protocol.md, "Same-machine fetch: V.EXPORT"). The directory of the
    # files handed to loopback clients: None = "pion-export" in the data directory; a
    # relative path is taken under the data directory, an absolute one as it is (e.g.
    # on a tmpfs). Pion's $PION_EXPORT_DIR sets it from the environment.
    export_enabled: bool = field(
        default=True,
        metadata=flag(
            name="--no-export",
            negate=True,
            help="Refuse V.EXPORT (same-machine clients fetch by TCP).",
        ),
    )
    export_dir: Path | None = field(
        default=None,
        metadata=flag(
            env="PION_EXPORT_DIR",
            help="Directory of V.EXPORT files (or $PION_EXPORT_DIR); relative to --dir. "
            "[default: pion-export]",
        ),
    )
    # Bytes all export files may use together; the least recently served go first.
    # 4 GiB: one file as large as the largest fetch reply (MAX_REPLY_BYTES) fits.
    export_max_bytes: int = field(
        default=4 << 30,
        metadata=flag(memory=True, help="Bytes all V.EXPORT files may use together."),
    )

    @property
    def export_directory(self) -> Path:
        """Where V.EXPORT writes (see ``export_dir``), as an absolute path."""
        return (self.dir / (self.export_dir or DEFAULT_EXPORT_DIR)).absolute()

    @property
    def auth_required(self) -> bool:
        """True when clients must AUTH. An empty password is no password."""
        return bool(self.requirepass)
