"""CONFIG GET|SET|RESETSTAT over a documented subset of the server's settings.

Readable: bind, port, dir, requirepass, maxmemory, vstore-max-sessions, appendonly,
appendfsync, save, databases, loglevel, worker-id. Settable at runtime: maxmemory,
vstore-max-sessions, loglevel. Anything else answers an error naming the parameter,
so a client never believes a setting took effect when it did not.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
from collections.abc import Callable, Sequence

from pion.commands.args import Args
from pion.commands.state import Context
from pion.errors import PionError
from pion.resp.reply import Reply, Simple

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
        "vstore-max-sessions": lambda: str(cfg.vstore_max_sessions),
        "appendonly": lambda: "yes" if persistence is not None and cfg.wal_enabled else "no",
        "appendfsync": lambda: cfg.appendfsync,
        "save": lambda: "",
        "databases": lambda: "1",
        "loglevel": lambda: cfg.log_level,
        "worker-id": lambda: str(cfg.worker_id),
    }


def _set(ctx: Context, name: str, value: str) -> None:
    state = ctx.state
    if name == "maxmemory":
        n = parse_memory(value)
        state.vstore.set_limits(maxmemory=n)
        state.config = dataclasses.replace(state.config, maxmemory=n)
    elif name == "vstore-max-sessions":
        if not value.isdigit() or not 1 <= int(value) <= 1_000_000:
            raise PionError("CONFIG SET vstore-max-sessions: want an integer 1..1000000")
        n = int(value)
        state.vstore.set_limits(max_sessions=n)
        state.config = dataclasses.replace(state.config, vstore_max_sessions=n)
    elif name == "loglevel":
        level = value.lower()
        if level not in ("debug", "info", "notice", "warning", "error"):
            raise PionError(f"Invalid argument '{value}' for CONFIG SET 'loglevel'")
        logging.getLogger("pion").setLevel("WARNING" if level == "notice" else level.upper())
        state.config = dataclasses.replace(state.config, log_level=level)
    else:
        raise PionError(f"Unknown option or number of arguments for CONFIG SET - '{name}'")


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
        pairs = []
        while not cur.done():
            pairs.append((cur.text("parameter").lower(), cur.text("value")))
        for name, _ in pairs:  # validate every name before changing anything
            if name not in ("maxmemory", "vstore-max-sessions", "loglevel"):
                raise PionError(f"Unknown option or number of arguments for CONFIG SET - '{name}'")
        for name, value in pairs:
            _set(ctx, name, value)
        return Simple("OK")
    if sub == "RESETSTAT" and cur.done():
        ctx.state.counters.reset()
        ctx.state.receipt.reset()
        return Simple("OK")
    raise PionError(
        f"unknown subcommand or wrong number of arguments for '{sub.lower()}'. Try CONFIG HELP."
    )
