"""CONFIG GET|SET|RESETSTAT over a documented subset of the server's settings.

Readable: bind, port, dir, requirepass, maxmemory, maxmemory-policy,
vstore-max-sessions, appendonly,
appendfsync, save, databases, loglevel, worker-id, maxclients, maxmemory-clients,
slowlog-log-slower-than, slowlog-max-len, client-output-buffer-limit,
notify-keyspace-events, busy-reply-threshold (alias lua-time-limit),
hll-sparse-max-bytes. Settable at runtime: maxmemory, maxmemory-policy
(``budget.py``), vstore-max-sessions, loglevel,
maxclients, maxmemory-clients, slowlog-log-slower-than, slowlog-max-len,
client-output-buffer-limit, notify-keyspace-events, busy-reply-threshold,
lua-time-limit and hll-sparse-max-bytes (``pion.pubsub`` and
``pion.notify`` hold and apply the two of pub/sub, the script runtime
``pion.scripting`` the busy threshold; the slowlog two live in ``stats.py``'s slow
log, not in the startup config). Anything else answers an error naming the parameter,
so a client never believes a setting took effect when it did not. ``CONFIG SET`` with several
pairs is atomic, as in Redis 7: all are checked first, then all applied, or none.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from collections.abc import Callable, Sequence
from typing import Any

from pion.commands.args import Args
from pion.commands.budget import parse_policy
from pion.commands.state import Context, ServerState
from pion.errors import PionError
from pion.notify import configure, flags_text, parse_flags
from pion.pubsub import OutputLimit
from pion.resp.reply import Reply, Simple
from pion.scripting.runtime import Scripts

__all__ = ["config", "parse_memory"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1024,
    "m": 1000**2,
    "mb": 1024**2,
    "g": 1000**3,
    "gb": 1024**3,
}


def parse_memory(text: str) -> int:
    """Redis's memtoll: ``100mb``, ``1gb``, ``4096``; case-insensitive."""
    raw = text.strip().lower()
    digits = raw.rstrip("kmgb")
    unit = raw[len(digits) :]
    if not digits.isdigit() or unit not in _UNITS:
        raise PionError(f"argument must be a memory value ('{text}')")
    return int(digits) * _UNITS[unit]


def _getters(ctx: Context) -> dict[str, Callable[[], str]]:
    cfg = ctx.state.config
    persistence = ctx.state.persistence
    return {
        "bind": lambda: cfg.bind,
        "port": lambda: str(cfg.port),
        "dir": lambda: str(cfg.dir),
        "requirepass": lambda: cfg.requirepass or "",
        "maxmemory": lambda: str(cfg.maxmemory),
        "maxmemory-policy": lambda: ctx.state.memory.policy,
        "vstore-max-sessions": lambda: str(cfg.vstore_max_sessions),
        "appendonly": lambda: "yes" if persistence is not None and cfg.wal_enabled else "no",
        "appendfsync": lambda: cfg.appendfsync,
        "save": lambda: "",
        "databases": lambda: str(cfg.databases),
        "loglevel": lambda: cfg.log_level,
        "worker-id": lambda: str(cfg.worker_id),
        "maxclients": lambda: str(cfg.maxclients),
        "maxmemory-clients": lambda: str(cfg.maxmemory_clients),
        "slowlog-log-slower-than": lambda: str(ctx.state.stats.slowlog_threshold_us),
        "slowlog-max-len": lambda: str(ctx.state.stats.slowlog.maxlen),
        "client-output-buffer-limit": lambda: " ".join(
            f"{name} {limit.text()}" for name, limit in ctx.state.pubsub.limits.items()
        ),
        "notify-keyspace-events": lambda: flags_text(ctx.state.notify_flags),
        "busy-reply-threshold": lambda: str(_scripts(ctx.state).busy_ms),
        "lua-time-limit": lambda: str(_scripts(ctx.state).busy_ms),
        "hll-sparse-max-bytes": lambda: str(cfg.hll_sparse_max_bytes),
    }


def _scripts(state: ServerState) -> Scripts:
    if state.scripts is None:
        state.scripts = Scripts()
    return state.scripts


# A setting's parser: the value as sent -> what applies it. Parsing raises PionError
# and changes nothing; applying cannot fail, which is what makes CONFIG SET atomic.
_Apply = Callable[[ServerState], None]
_Parser = Callable[[str], _Apply]


def _replace(state: ServerState, **changes: Any) -> None:
    state.config = dataclasses.replace(state.config, **changes)


def _int_in(value: str, lo: int, hi: int) -> int:
    if not value.isdigit() or len(value) > 19 or not lo <= int(value) <= hi:
        raise PionError(f"argument must be an integer between {lo} and {hi}")
    return int(value)


def _maxmemory(value: str) -> _Apply:
    n = parse_memory(value)

    def apply(state: ServerState) -> None:
        state.vstore.set_limits(maxmemory=n)
        _replace(state, maxmemory=n)

    return apply


def _maxmemory_policy(value: str) -> _Apply:
    policy = parse_policy(value)

    def apply(state: ServerState) -> None:
        state.memory.set_policy(policy)
        _replace(state, maxmemory_policy=policy)

    return apply


def _max_sessions(value: str) -> _Apply:
    n = _int_in(value, 1, 1_000_000)

    def apply(state: ServerState) -> None:
        state.vstore.set_limits(max_sessions=n)
        _replace(state, vstore_max_sessions=n)

    return apply


def _loglevel(value: str) -> _Apply:
    level = value.lower()
    if level not in _LEVELS:
        raise PionError(f"argument(s) must be one of the following: {', '.join(_LEVELS)}")

    def apply(state: ServerState) -> None:
        logging.getLogger("pion").setLevel("WARNING" if level == "notice" else level.upper())
        _replace(state, log_level=level)

    return apply


def _maxclients(value: str) -> _Apply:
    # Connections beyond a lowered limit stay; new ones are refused (as in Redis).
    n = _int_in(value, 1, 1_000_000)
    return lambda state: _replace(state, maxclients=n)


def _maxmemory_clients(value: str) -> _Apply:
    n = parse_memory(value)
    return lambda state: _replace(state, maxmemory_clients=n)


def _long_in(value: str, lo: int) -> int:
    """Redis's long long config: an integer from ``lo`` to LLONG_MAX, its texts."""
    try:
        n = int(value, 10)
    except ValueError:
        raise PionError("argument couldn't be parsed into an integer") from None
    if not lo <= n <= _LLONG_MAX:
        raise PionError(f"argument must be between {lo} and {_LLONG_MAX} inclusive")
    return n


_LLONG_MAX = (1 << 63) - 1


def _slowlog_threshold(value: str) -> _Apply:
    n = _long_in(value, -1)

    def apply(state: ServerState) -> None:
        state.stats.slowlog_threshold_us = n

    return apply


def _slowlog_max_len(value: str) -> _Apply:
    # Bounded by what a deque may hold; Redis's bound is LONG_MAX.
    n = _long_in(value, 0)

    def apply(state: ServerState) -> None:
        state.stats.set_slowlog_max_len(n)

    return apply


def _notify_events(value: str) -> _Apply:
    flags = parse_flags(value)

    def apply(state: ServerState) -> None:
        configure(state, flags)

    return apply


def _output_limits(value: str) -> _Apply:
    """``<class> <hard> <soft> <soft seconds>`` repeated (Redis's texts for each
    error); a class given twice takes its last values."""
    words = value.split()
    if len(words) % 4:
        raise PionError("Wrong number of arguments in buffer limit configuration.")
    limits: dict[str, OutputLimit] = {}
    for i in range(0, len(words), 4):
        name = words[i].lower()
        name = "slave" if name == "replica" else name
        if name not in ("normal", "slave", "pubsub"):
            raise PionError("Invalid client class specified in buffer limit configuration.")
        try:
            hard, soft = parse_memory(words[i + 1]), parse_memory(words[i + 2])
            seconds = int(words[i + 3], 10)
        except (PionError, ValueError):
            seconds = -1
        if seconds < 0:
            raise PionError(
                "Error in hard, soft or soft_seconds setting in buffer limit configuration."
            )
        limits[name] = OutputLimit(hard, soft, seconds)

    def apply(state: ServerState) -> None:
        state.pubsub.limits.update(limits)

    return apply


def _busy_threshold(value: str) -> _Apply:
    n = _long_in(value, 0)

    def apply(state: ServerState) -> None:
        _scripts(state).busy_ms = n

    return apply


def _hll_sparse_max_bytes(value: str) -> _Apply:
    # Redis's size_t memory config: 0 to LONG_MAX.
    n = parse_memory(value)
    if n > _LLONG_MAX:
        raise PionError(f"argument must be between 0 and {_LLONG_MAX} inclusive")
    return lambda state: _replace(state, hll_sparse_max_bytes=n)


_LEVELS = ("debug", "info", "notice", "warning", "error")
_SETTABLE: dict[str, _Parser] = {
    "maxmemory": _maxmemory,
    "maxmemory-policy": _maxmemory_policy,
    "vstore-max-sessions": _max_sessions,
    "loglevel": _loglevel,
    "maxclients": _maxclients,
    "maxmemory-clients": _maxmemory_clients,
    "slowlog-log-slower-than": _slowlog_threshold,
    "slowlog-max-len": _slowlog_max_len,
    "client-output-buffer-limit": _output_limits,
    "notify-keyspace-events": _notify_events,
    "busy-reply-threshold": _busy_threshold,
    "lua-time-limit": _busy_threshold,
    "hll-sparse-max-bytes": _hll_sparse_max_bytes,
}


def _config_set(ctx: Context, cur: Args) -> Reply:
    """Redis 7's CONFIG SET: every name and value is checked before any is applied,
    so ``CONFIG SET a x b bad`` changes nothing."""
    appliers: list[_Apply] = []
    seen: set[str] = set()
    while not cur.done():
        raw_name, raw_value = cur.arg("parameter"), cur.arg("value")
        name = raw_name.decode("utf-8", "replace").lower()
        parser = _SETTABLE.get(name)
        if parser is None:
            raise PionError(f"Unknown option or number of arguments for CONFIG SET - '{name}'")
        if name in seen:
            raise PionError(
                f"CONFIG SET failed (possibly related to argument '{name}') - duplicate parameter"
            )
        seen.add(name)
        try:
            appliers.append(parser(raw_value.decode("utf-8", "replace")))
        except PionError as exc:
            raise PionError(
                f"CONFIG SET failed (possibly related to argument '{name}') - {exc.message}"
            ) from None
    for apply in appliers:
        apply(ctx.state)
    return Simple("OK")


def config(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "CONFIG")
    sub = cur.keyword()
    if sub == "GET" and len(cur) >= 1:
        getters = _getters(ctx)
        found: dict[str | bytes, Reply] = {}
        for raw in cur.rest():
            pattern = raw.decode("utf-8", "replace").lower()
            for name, get in getters.items():
                if fnmatch.fnmatchcase(name, pattern):
                    found[name] = get()
        return found
    if sub == "SET" and len(cur) >= 2 and len(cur) % 2 == 0:
        return _config_set(ctx, cur)
    if sub == "RESETSTAT" and cur.done():
        ctx.state.counters.reset()
        ctx.state.receipt.reset()
        ctx.state.databases.reset_stats()
        ctx.state.memory.evicted_keys = 0
        ctx.state.stats.reset()
        return Simple("OK")
    raise PionError(
        f"unknown subcommand or wrong number of arguments for '{sub.lower()}'. Try CONFIG HELP."
    )
