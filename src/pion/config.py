"""Frozen configuration dataclasses for the server and its protocol limits.

Every limit the server enforces is a named field here with its provenance, so a test
or an operator can see and change it, and so it is checked before anything is
allocated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pion.codecs.base import MAX_DIM
from pion.resp.limits import MB, ProtocolLimits

__all__ = [
    "DEFAULT_EXPORT_DIR",
    "AppendFsync",
    "ProtocolLimits",
    "ServerConfig",
    "TierConfig",
    "TierWrite",
    "VStoreLimits",
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
class TierConfig:
    """The shared second tier on a Valkey / Redis Cluster or one redis-server
    (``--tier``; see ``pion.tier`` and docs/tier.md)."""

    # redis://[user:password@]host:port[,host:port...] (rediss:// for TLS); parsed and
    # checked by pion.tier.url.parse_tier_url.
    url: str
    # sync: a write's reply waits for the tier while it is reachable; async: it is
    # queued and written behind. Either way a tier that is down never fails a write.
    write: TierWrite = "sync"
    username: str | None = None
    password: str | None = None
    tls: bool = False
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # Every key starts with "<prefix>:v<format version>:", so several deployments (or
    # a future format) can share one cluster.
    prefix: str = "pion"
    # Seconds one tier round trip may take (socket timeout). Reads block the worker's
    # loop while they wait, so this bounds how long a slow tier can stall it.
    timeout: float = 2.0
    # How long a sync write waits for the tier before its reply goes out anyway (the
    # write stays queued and is retried).
    sync_timeout: float = 5.0
    # Bound of the write-behind queue: copies of payloads waiting for the tier. Past it
    # a session is marked for a full resync instead of queueing more (pion.tier.writer).
    queue_max_bytes: int = 256 << 20
    queue_max_ops: int = 65_536
    # How long shutdown waits for queued writes to reach the tier.
    drain_timeout: float = 5.0


@dataclass(frozen=True)
class ServerConfig:
    """Everything `pion-server` is started with."""

    bind: str = "127.0.0.1"
    port: int = 1974
    dir: Path = field(default_factory=lambda: Path("./data"))
    requirepass: str | None = None
    unsafe_no_auth: bool = False
    vstore_max_sessions: int = 256
    maxmemory: int = 0  # bytes of vstore_bytes; 0 = no budget
    log_level: str = "info"
    appendfsync: AppendFsync = "everysec"
    wal_enabled: bool = True
    save_interval: float = 0.0  # seconds between automatic snapshots; 0 = off
    worker_id: int = 0
    # -w N --independent-workers: N worker processes under a supervisor.
    workers: int = 1
    # TLS on the RESP ports and the binary lane: a PEM certificate chain and its key;
    # with tls_ca, clients must present a certificate signed by it.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # Prometheus text format on this port (0 picks a free one); None = no endpoint.
    metrics_port: int | None = None
    # Attention tier (docs/attention.md). fa_window: the default sliding window of a query
    # that sends none (0 = full attention, N = the last N prefix tokens).
    fa_window: int = 0
    # Redis's maxclients default. At startup the open-files limit is raised to fit it
    # (or it is lowered to fit the limit, with a warning), as Redis does, so the
    # descriptor limit is never what stops a connection: the next one is answered
    # "-ERR max number of clients reached" and closed.
    maxclients: int = 10_000
    # Bytes all clients' query and reply buffers may hold together (Redis 7's
    # maxmemory-clients, off by default there). Over it, the clients holding the most
    # are disconnected, largest first (Redis's client eviction). 2 GiB is twice the
    # largest single command the protocol limits admit (max_query_buffer, 1 GiB), so
    # one maximal upload never trips it. 0 = no bound.
    maxmemory_clients: int = 2048 * MB
    attend_warm_slots: int = 256  # WARM table slots (Pion's SDPA_SLOTS)
    attend_cold_slots: int = 1024  # COLD registry entries (Pion's SDPA_COLD_SLOTS)
    attend_maxmemory: int = 0  # bytes of K/V in WARM slots; 0 = no byte budget
    ssm_maxmemory: int = 0  # bytes of SSM.PREFIX blobs; 0 = no budget
    # The binary lane (docs/attention.md): None = the RESP port + 1, as Pion's client assumes.
    binary_lane: bool = True
    binary_port: int | None = None
    protocol: ProtocolLimits = field(default_factory=ProtocolLimits)
    vstore: VStoreLimits = field(default_factory=VStoreLimits)
    tier: TierConfig | None = None  # None: no shared second tier
    # V.EXPORT (docs/protocol.md, "Same-machine fetch: V.EXPORT"). The directory of the
    # files handed to loopback clients: None = "pion-export" in the data directory; a
    # relative path is taken under the data directory, an absolute one as it is (e.g.
    # on a tmpfs). Pion's $PION_EXPORT_DIR sets it from the environment.
    export_enabled: bool = True
    export_dir: Path | None = None
    # Bytes all export files may use together; the least recently served go first.
    # 4 GiB: one file as large as the largest fetch reply (MAX_REPLY_BYTES) fits.
    export_max_bytes: int = 4 << 30

    @property
    def export_directory(self) -> Path:
        """Where V.EXPORT writes (see ``export_dir``), as an absolute path."""
        return (self.dir / (self.export_dir or DEFAULT_EXPORT_DIR)).absolute()

    @property
    def auth_required(self) -> bool:
        """True when clients must AUTH. An empty password is no password."""
        return bool(self.requirepass)
