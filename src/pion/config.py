"""Frozen configuration dataclasses for the server and its protocol limits.

Every limit the server enforces is a named field here with its provenance, so a test
or an operator can see and change it, and so it is checked before anything is
allocated (STYLE rule 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["AppendFsync", "ProtocolLimits", "ServerConfig", "VStoreLimits"]

AppendFsync = Literal["always", "everysec", "no"]

MB = 1024 * 1024


@dataclass(frozen=True)
class ProtocolLimits:
    """Bounds on what one client may make the server buffer (DESIGN section 3)."""

    # Redis's proto-max-bulk-len default.
    max_bulk_len: int = 512 * MB
    # Redis's client-query-buffer-limit default; here it bounds the declared size
    # of one pending command, checked as each header arrives.
    max_query_buffer: int = 1024 * MB
    # Redis's PROTO_INLINE_MAX_SIZE.
    max_inline_len: int = 64 * 1024
    # Redis accepts up to 1024*1024*1024 elements; we cap a command at 1M arguments.
    max_array_len: int = 1024 * 1024
    # The binary lane's frame body (docs/attention.md): the same bound as one RESP bulk, so
    # the fast lane can never be made to buffer more than the RESP port.
    max_binary_body: int = 512 * MB


@dataclass(frozen=True)
class VStoreLimits:
    """Per-command bounds of the V-store (DESIGN section 4.2)."""

    max_layers: int = 80  # layers 0..79, as in Pion
    max_rows: int = 200_000  # rows per layer
    max_dim: int = 8192
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
    attend_warm_slots: int = 256  # WARM table slots (Pion's SDPA_SLOTS)
    attend_cold_slots: int = 1024  # COLD registry entries (Pion's SDPA_COLD_SLOTS)
    attend_maxmemory: int = 0  # bytes of K/V in WARM slots; 0 = no byte budget
    ssm_maxmemory: int = 0  # bytes of SSM.PREFIX blobs; 0 = no budget
    # The binary lane (docs/attention.md): None = the RESP port + 1, as Pion's client assumes.
    binary_lane: bool = True
    binary_port: int | None = None
    protocol: ProtocolLimits = field(default_factory=ProtocolLimits)
    vstore: VStoreLimits = field(default_factory=VStoreLimits)
