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
from pion.resp.limits import ProtocolLimits

__all__ = ["AppendFsync", "ProtocolLimits", "ServerConfig", "VStoreLimits"]

AppendFsync = Literal["always", "everysec", "no"]


@dataclass(frozen=True)
class VStoreLimits:
    """Per-command bounds of the V-store (DESIGN section 4.2)."""

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
    # -w N --independent-workers: N worker processes under a supervisor.
    workers: int = 1
    # TLS on the RESP port and the affinity ports: a PEM certificate chain
    # and its key; with tls_ca, clients must present a certificate signed by it.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # Prometheus text format on this port (0 picks a free one); None = no endpoint.
    metrics_port: int | None = None
    fa_window: int = 0
    protocol: ProtocolLimits = field(default_factory=ProtocolLimits)
    vstore: VStoreLimits = field(default_factory=VStoreLimits)
