"""INFO: the server's state as ``name:value`` lines grouped in ``# Section`` blocks.

Sections: Server, Clients, Memory, Persistence, Stats, Pion, Tier, Keyspace, and
Commandstats and Errorstats (``pion.commands.stats``). ``INFO`` and ``INFO default``
give all but the last two; ``INFO all``/``everything`` all of them, as in Redis;
``INFO <section>...`` those named (case-insensitive); an unknown section gives an
empty reply, as in Redis.

Memory carries the fields operators' Redis tools read. ``used_memory`` is the number
``--maxmemory`` bounds (``pion.commands.budget``: the server's memory at startup, what
every store accounts for its data, and the clients' buffers), computed, so a write is
checked against it before it allocates:

``used_memory``          ``used_memory_startup`` + ``used_memory_dataset`` +
                         ``mem_clients_normal``; tracks the kernel's ``RssAnon`` growth
                         within 1.5x (``tests/server/test_used_memory.py``).
``used_memory_rss``      the whole resident set (Linux ``VmRSS``; the peak elsewhere).
``used_memory_peak``     the highest ``used_memory`` this server computed.
``used_memory_startup``  ``RssAnon`` when the server's state was built (interpreter,
                         modules), before recovery loaded any data.
``used_memory_dataset``  ``vstore_bytes`` + ``keyspace_bytes`` + ``sdpa_warm_bytes``
                         + ``ssm_bytes``.
``maxmemory``            ``--maxmemory``, a bound on ``used_memory``; 0 is none.
``maxmemory_policy``     ``maxmemory-policy`` (default ``volatile-lru``).
``rss_anon``             ours: the kernel's ``RssAnon`` now, beside the computed number.

and ``*_human`` forms written as Redis writes them (``1.50M``).
"""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Callable, Sequence

from pion import __version__
from pion.commands.blocking import blocked_count
from pion.commands.budget import anon_bytes
from pion.commands.state import Context
from pion.pubsub import Kind
from pion.resp.reply import Reply, Verbatim

__all__ = ["bytes_to_human", "info_command", "rss_bytes"]


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bytes_to_human(n: int) -> str:
    """Redis's bytesToHuman: ``512B``, ``1.50K``, ``12.00M``, ``3.25G`` ..."""
    if n < 1024:
        return f"{n}B"
    value = float(n)
    for unit in "KMGTP":
        value /= 1024
        if value < 1024 or unit == "P":
            return f"{value:.2f}{unit}"
    return f"{n}B"  # unreachable: the loop returns at P


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
        f"workers:{cfg.workers}",
    ]


def _clients(ctx: Context) -> list[str]:
    return [
        f"connected_clients:{len(ctx.state.clients)}",
        f"maxclients:{ctx.state.config.maxclients}",
        # Clients waiting in BLPOP, BZPOPMIN, XREAD BLOCK and the other blocking
        # commands (pion.commands.blocking); redis-cli --stat shows this column.
        f"blocked_clients:{blocked_count(ctx.state.databases)}",
    ]


def _memory(ctx: Context) -> list[str]:
    state = ctx.state
    vs = state.vstore
    measure = state.client_memory
    clients = measure() if measure is not None else 0  # fresh, for used_memory too
    memory = state.memory
    used = memory.used()
    rss = rss_bytes()
    maxmemory = vs.maxmemory
    tables = state.attention
    return [
        f"used_memory:{used}",
        f"used_memory_human:{bytes_to_human(used)}",
        f"used_memory_rss:{rss}",
        f"used_memory_rss_human:{bytes_to_human(rss)}",
        f"used_memory_peak:{memory.peak}",
        f"used_memory_peak_human:{bytes_to_human(memory.peak)}",
        f"used_memory_startup:{memory.startup}",
        f"used_memory_dataset:{memory.dataset()}",
        f"maxmemory:{maxmemory}",
        f"maxmemory_human:{bytes_to_human(maxmemory)}",
        f"maxmemory_policy:{memory.policy}",
        f"rss_anon:{anon_bytes()}",
        f"vstore_bytes:{vs.vstore_bytes}",
        f"vstore_bytes_allocated:{vs.bytes_allocated}",
        f"keyspace_bytes:{state.databases.used_bytes}",
        # Redis's name: every client's query buffer and unsent replies, measured now.
        f"mem_clients_normal:{clients}",
        f"maxmemory_clients:{state.config.maxmemory_clients}",
        f"vstore_max_sessions:{vs.max_sessions}",
        f"sdpa_warm_bytes:{tables.bytes}",
        f"attend_maxmemory:{tables.max_bytes}",
        f"attend_slots:{tables.warm_slots}",
        f"attend_cold_slots:{tables.cold_slots}",
        f"ssm_bytes:{state.ssm.bytes}",
        f"ssm_maxmemory:{state.ssm.max_bytes}",
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
    tables = ctx.state.attention
    dbs = ctx.state.databases
    pubsub = ctx.state.pubsub
    return [
        f"total_connections_received:{c.total_connections_received}",
        f"total_commands_processed:{c.total_commands_processed}",
        f"rejected_connections:{c.rejected_connections}",
        f"evicted_clients:{c.evicted_clients}",
        f"total_protocol_errors:{c.protocol_errors}",
        f"total_internal_errors:{c.internal_errors}",
        f"offloaded_commands:{c.offloaded_commands}",
        f"client_io_errors:{c.io_errors}",
        f"client_slices_yielded:{c.slices_yielded}",
        f"vstore_total_fetches:{vs.total_fetches}",
        f"vstore_evictions:{vs.evictions}",
        f"sdpa_warm:{tables.warm_count}",
        f"sdpa_cold:{tables.cold_count}",
        f"sdpa_demotions:{tables.demotions}",
        f"sdpa_rehydrates:{tables.rehydrates}",
        f"sdpa_cold_forgotten:{tables.forgotten}",
        f"ssm_entries:{len(ctx.state.ssm)}",
        f"expired_keys:{dbs.total('expired_keys')}",
        f"evicted_keys:{ctx.state.memory.evicted_keys}",
        f"expired_subkeys:{dbs.total('expired_fields')}",
        f"keyspace_hits:{dbs.total('hits')}",
        f"keyspace_misses:{dbs.total('misses')}",
        f"pubsub_channels:{len(pubsub.table[Kind.CHANNEL])}",
        f"pubsub_patterns:{len(pubsub.table[Kind.PATTERN])}",
        f"pubsubshard_channels:{len(pubsub.table[Kind.SHARD])}",
        f"client_output_buffer_limit_disconnections:{pubsub.limit_disconnects}",
        f"total_error_replies:{ctx.state.stats.error_replies}",
    ]


def _pion(ctx: Context) -> list[str]:
    return ctx.state.receipt.info_lines()


def _tier(ctx: Context) -> list[str]:
    tier = ctx.state.tier
    return ["tier_enabled:0"] if tier is None else tier.info_lines()


def _keyspace(ctx: Context) -> list[str]:
    # Redis's line per database, each left out while it is empty (as Redis does). Only
    # the plain keyspace: V-store sessions are counted by KV.PREFIX.INFO.
    lines = []
    for ks in ctx.state.databases:
        if not len(ks):
            continue
        # subexpiry: the hashes with some field deadline (Redis 7.4's field).
        subexpiry = len(ks.field_ttls.by_key)
        lines.append(
            f"db{ks.db}:keys={len(ks)},expires={ks.volatile},avg_ttl={ks.avg_ttl()},"
            f"subexpiry={subexpiry}"
        )
    return lines


_SECTIONS: dict[str, tuple[str, Callable[[Context], list[str]]]] = {
    "server": ("Server", _server),
    "clients": ("Clients", _clients),
    "memory": ("Memory", _memory),
    "persistence": ("Persistence", _persistence),
    "stats": ("Stats", _stats),
    "pion": ("Pion", _pion),
    "tier": ("Tier", _tier),
    "keyspace": ("Keyspace", _keyspace),
    "commandstats": ("Commandstats", lambda ctx: ctx.state.stats.commandstats_lines()),
    "errorstats": ("Errorstats", lambda ctx: ctx.state.stats.errorstats_lines()),
}
# Redis leaves these out of INFO and INFO default.
_NOT_DEFAULT = ("commandstats", "errorstats")
_ALL = ("all", "everything")


def info_command(ctx: Context, args: Sequence[bytes]) -> Reply:
    wanted = [a.decode("utf-8", "replace").lower() for a in args]
    if any(w in _ALL for w in wanted):
        names = list(_SECTIONS)
    elif not wanted or "default" in wanted:
        extra = [w for w in wanted if w in _NOT_DEFAULT]
        names = [n for n in _SECTIONS if n not in _NOT_DEFAULT] + extra
    else:
        names = [w for w in dict.fromkeys(wanted) if w in _SECTIONS]
    blocks = []
    for name in names:
        title, fn = _SECTIONS[name]
        blocks.append("\r\n".join([f"# {title}", *fn(ctx)]))
    return Verbatim("\r\n\r\n".join(blocks) + ("\r\n" if blocks else ""))
