"""Frozen configuration dataclasses for the server and its protocol limits.

Every limit the server enforces is a named field here with its provenance, so a test
or an operator can see and change it, and so it is checked before anything is
allocated (STYLE rule 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pion.codecs.base import MAX_DIM
from pion.resp.limits import MB, ProtocolLimits

__all__ = ["AppendFsync", "ProtocolLimits", "ServerConfig", "VStoreLimits"]

AppendFsync = Literal["always", "everysec", "no"]


@dataclass(frozen=True)
class VStoreLimits:
    """Per-command bounds of the V-store (docs/protocol.md, "Protocol limits")."""

    max_layers: int = 80  # layers 0..79, as in Pion
    max_rows: int = 200_000  # rows per layer
    max_dim: int = MAX_DIM  # what every codec supports
    max_schema_layers: int = 59  # Pion's RESP3 inline-array limit: 5 + N <= 64
    max_fetch_ids: int = 1024  # legacy V.FETCH id list


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

    @property
    def auth_required(self) -> bool:
        """True when clients must AUTH. An empty password is no password."""
        return bool(self.requirepass)
