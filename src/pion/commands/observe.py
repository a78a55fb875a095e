"""Server commands operators and clients use to observe the server: WAIT, MEMORY
USAGE|STATS|HELP, SLOWLOG GET|LEN|RESET|HELP (the slow log and its settings are
``stats.py``'s), with Redis 7.0's replies and error texts.

WAIT: Pion has no replicas, so no write is ever acknowledged by one. WAIT answers 0 at
once instead of sleeping out its timeout (Redis blocks up to ``timeout`` ms when asked
for more replicas than it has, forever with 0); a client asking for replicas learns
the same answer without the wait.

MEMORY USAGE answers what the key counts against ``--maxmemory`` (``used_bytes``'s
share: the key, its value and the per-object overheads of ``pion.keyspace.entries``);
SAMPLES is accepted and checked, and every field is counted. MEMORY STATS answers
Redis's field names where Pion has the quantity, plus Pion's own stores.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.info import rss_bytes
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS"]

_SLOWLOG_HELP = [
    "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "GET [<count>]",
    "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
    "    Entries are made of:",
    "    id, timestamp, time in microseconds, arguments array, client IP and port,",
    "    client name",
    "LEN",
    "    Return the length of the slowlog.",
    "RESET",
    "    Reset the slowlog.",
    "HELP",
    "    Prints this help.",
]
_MEMORY_HELP = [
    "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "STATS",
    "    Return information about the memory usage of the server.",
    "USAGE <key> [SAMPLES <count>]",
    "    Return memory in bytes used by <key> and its value. Nested values are",
    "    sampled up to <count> times (default: 5, 0 means sample all).",
    "HELP",
    "    Prints this help.",
]
_SLOWLOG_DEFAULT_COUNT = 10


def _wait(ctx: Context, args: Sequence[bytes]) -> Reply:
    if parse_int64(args[0]) is None:
        raise PionError("value is not an integer or out of range")
    timeout = parse_int64(args[1])
    if timeout is None:
        raise PionError("timeout is not an integer or out of range")
    if timeout < 0:
        raise PionError("timeout is negative")
    return 0


def _subcommand_arity(command: str, sub: str) -> PionError:
    return PionError(f"wrong number of arguments for '{command}|{sub.lower()}' command")


def _unknown_subcommand(command: str, sub: str) -> PionError:
    return PionError(f"unknown subcommand '{sub[:128]}'. Try {command} HELP.")


def _memory_usage(ctx: Context, args: Sequence[bytes]) -> Reply:
    i = 1
    while i < len(args):
        if args[i].upper() == b"SAMPLES" and i + 1 < len(args):
            samples = parse_int64(args[i + 1])
            if samples is None:
                raise PionError("value is not an integer or out of range")
            if samples < 0:
                raise PionError("syntax error")
            i += 2
        else:
            raise PionError("syntax error")
    e = ctx.state.keyspace.peek(args[0])
    return None if e is None else e.size


def _memory_stats(ctx: Context) -> Reply:
    state = ctx.state
    dbs = state.databases
    keys, key_bytes = dbs.keys(), dbs.used_bytes
    measure = state.client_memory
    clients = measure() if measure is not None else 0
    memory = state.memory
    used, peak, rss = memory.used(), memory.peak, rss_bytes()
    dataset = memory.dataset()
    out: dict[str | bytes, Reply] = {
        "peak.allocated": peak,
        "total.allocated": used,
        "startup.allocated": memory.startup,
        "clients.normal": clients,
        "keys.count": keys,
        "keys.bytes-per-key": key_bytes // keys if keys else 0,
        "dataset.bytes": dataset,
        "dataset.percentage": 100.0 * dataset / used if used else 0.0,
        "peak.percentage": 100.0 * used / peak if peak else 0.0,
        "keyspace.bytes": key_bytes,
        "vstore.bytes": state.vstore.vstore_bytes,
        "rss": rss,
    }
    return out


def _memory(ctx: Context, args: Sequence[bytes]) -> Reply:
    sub = args[0].decode("utf-8", "replace")
    upper = sub.upper()
    if upper == "USAGE":
        if len(args) < 2:
            raise _subcommand_arity("memory", sub)
        return _memory_usage(ctx, args[1:])
    if upper in ("STATS", "HELP"):
        if len(args) != 1:
            raise _subcommand_arity("memory", sub)
        if upper == "HELP":
            return [Simple(line) for line in _MEMORY_HELP]
        return _memory_stats(ctx)
    raise _unknown_subcommand("MEMORY", sub)


def _slowlog(ctx: Context, args: Sequence[bytes]) -> Reply:
    stats = ctx.state.stats
    sub = args[0].decode("utf-8", "replace")
    upper = sub.upper()
    if upper == "GET" and len(args) <= 2:
        count = _SLOWLOG_DEFAULT_COUNT
        if len(args) == 2:
            value = parse_int64(args[1])
            if value is None or value < -1:
                raise PionError("count should be greater than or equal to -1")
            count = len(stats.slowlog) if value == -1 else value
        entries = list(stats.slowlog)[:count]
        return [
            [
                e.id,
                e.timestamp,
                e.duration_us,
                list(e.args),
                e.client_addr.encode(),
                e.client_name.encode(),
            ]
            for e in entries
        ]
    if upper in ("LEN", "RESET", "HELP"):
        if len(args) != 1:
            raise _subcommand_arity("slowlog", sub)
        if upper == "LEN":
            return len(stats.slowlog)
        if upper == "RESET":
            stats.slowlog.clear()
            return Simple("OK")
        return [Simple(line) for line in _SLOWLOG_HELP]
    if upper == "GET":
        raise PionError(
            f"unknown subcommand or wrong number of arguments for '{sub[:128]}'. Try SLOWLOG HELP."
        )
    raise _unknown_subcommand("SLOWLOG", sub)


COMMANDS: list[Command] = [
    Command("WAIT", _wait, 3, frozenset(), "Wait for replicas (there are none: 0)"),
    Command("MEMORY", _memory, -2, frozenset({"readonly"}), "MEMORY USAGE|STATS|HELP"),
    Command("SLOWLOG", _slowlog, -2, frozenset({"admin", "loading"}), "SLOWLOG GET|LEN|RESET"),
]
