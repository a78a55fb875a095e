"""INFO: the server's state as ``name:value`` lines grouped in ``# Section`` blocks.

Sections: Server, Clients, Memory, Persistence, Stats, Pion, Keyspace. ``INFO`` and
``INFO default``/``all``/``everything`` give all of them; ``INFO <section>...`` those
named (case-insensitive); an unknown section gives an empty reply, as in Redis.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Callable, Sequence

from pion import __version__
from pion.commands.state import Context
from pion.resp.reply import Reply, Verbatim

__all__ = ["info_command", "rss_bytes"]


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _server(ctx: Context) -> list[str]:
    cfg = ctx.state.config
    return [
        "redis_version:7.2.0",
        f"pion_version:{__version__}",
        "redis_mode:standalone",
        f"os:{platform.system()} {platform.release()} {platform.machine()}",
        f"python_version:{sys.version.split()[0]}",
        f"process_id:{os.getpid()}",
        f"tcp_port:{cfg.port}",
        f"uptime_in_seconds:{ctx.state.uptime()}",
        f"worker_id:{cfg.worker_id}",
    ]


def _clients(ctx: Context) -> list[str]:
    return [f"connected_clients:{len(ctx.state.clients)}"]


def _memory(ctx: Context) -> list[str]:
    vs = ctx.state.vstore
    return [
        f"used_memory_rss:{rss_bytes()}",
        f"peak_memory_rss:{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}",
        f"vstore_bytes:{vs.vstore_bytes}",
        f"vstore_bytes_allocated:{vs.bytes_allocated}",
        f"keyspace_bytes:{ctx.state.keyspace.used_bytes}",
        f"maxmemory:{ctx.state.config.maxmemory}",
        f"vstore_max_sessions:{ctx.state.config.vstore_max_sessions}",
    ]


def _persistence(ctx: Context) -> list[str]:
    lines = [f"loading:{int(ctx.state.loading)}"]
    if ctx.state.persistence is None:
        lines.append("wal_enabled:0")
    else:
        lines.extend(f"{k}:{v}" for k, v in ctx.state.persistence.info().items())
    return lines


def _stats(ctx: Context) -> list[str]:
    c = ctx.state.counters
    vs = ctx.state.vstore
    ks = ctx.state.keyspace
    return [
        f"total_connections_received:{c.total_connections_received}",
        f"total_commands_processed:{c.total_commands_processed}",
        f"rejected_connections:{c.rejected_connections}",
        f"total_protocol_errors:{c.protocol_errors}",
        f"total_internal_errors:{c.internal_errors}",
        f"vstore_total_fetches:{vs.total_fetches}",
        f"vstore_evictions:{vs.evictions}",
        f"expired_keys:{ks.expired_keys}",
        f"keyspace_hits:{ks.hits}",
        f"keyspace_misses:{ks.misses}",
    ]


def _pion(ctx: Context) -> list[str]:
    return ctx.state.receipt.info_lines()


def _keyspace(ctx: Context) -> list[str]:
    # Redis's line for database 0, left out while it is empty (as Redis does). Only the
    # plain keyspace: V-store sessions are counted by KV.PREFIX.INFO.
    ks = ctx.state.keyspace
    if not len(ks):
        return []
    return [f"db0:keys={len(ks)},expires={ks.volatile},avg_ttl={ks.avg_ttl()}"]


_SECTIONS: dict[str, tuple[str, Callable[[Context], list[str]]]] = {
    "server": ("Server", _server),
    "clients": ("Clients", _clients),
    "memory": ("Memory", _memory),
    "persistence": ("Persistence", _persistence),
    "stats": ("Stats", _stats),
    "pion": ("Pion", _pion),
    "keyspace": ("Keyspace", _keyspace),
}
_ALL = ("default", "all", "everything")


def info_command(ctx: Context, args: Sequence[bytes]) -> Reply:
    wanted = [a.decode("utf-8", "replace").lower() for a in args]
    if not wanted or any(w in _ALL for w in wanted):
        names = list(_SECTIONS)
    else:
        names = [w for w in dict.fromkeys(wanted) if w in _SECTIONS]
    blocks = []
    for name in names:
        title, fn = _SECTIONS[name]
        blocks.append("\r\n".join([f"# {title}", *fn(ctx)]))
    return Verbatim("\r\n\r\n".join(blocks) + ("\r\n" if blocks else ""))
