"""XINFO STREAM [FULL [COUNT n]], XINFO GROUPS, XINFO CONSUMERS and XINFO HELP, with
Redis 7.0's fields in its order (maps in RESP3, flat arrays in RESP2).

``radix-tree-keys`` is the number of modelled listpack nodes (``streamtype.py``);
``radix-tree-nodes`` counts the nodes of Redis's radix tree, which Pion has no
equivalent of: it answers one more than the keys (what Redis shows for a stream of
one node), an estimate.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.state import Command, Context
from pion.commands.streams_args import entries_reply
from pion.commands.zsets import keyword, long_arg
from pion.errors import NoGroupError, PionError
from pion.keyspace.streams import stream_at
from pion.keyspace.streamtype import UNKNOWN, Group, Stream, format_id
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS"]

_HELP = [
    "XINFO <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CONSUMERS <key> <groupname>",
    "    Show consumers of <groupname>.",
    "GROUPS <key>",
    "    Show the stream consumer groups.",
    "STREAM <key> [FULL [COUNT <count>]",
    "    Show information about the stream.",
    "HELP",
    "    Prints this help.",
]
_ARITY = {"CONSUMERS": 4, "GROUPS": 3, "STREAM": -3, "HELP": 2}


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _syntax(sub: bytes) -> PionError:
    return PionError(
        f"unknown subcommand or wrong number of arguments for '{_text(sub)[:128]}'. Try XINFO HELP."
    )


def _xinfo(ctx: Context, args: Sequence[bytes]) -> Reply:
    sub = keyword(args[0])
    arity = _ARITY.get(sub)
    if arity is None:
        raise PionError(f"unknown subcommand '{_text(args[0])[:128]}'. Try XINFO HELP.")
    n = len(args) + 1
    if (arity > 0 and n != arity) or (arity < 0 and n < -arity):
        raise PionError(f"wrong number of arguments for 'xinfo|{sub.lower()}' command")
    if sub == "HELP":
        return [Simple(line) for line in _HELP]
    ks = ctx.state.keyspace
    s = stream_at(ks, args[1])
    if s is None:
        raise PionError("no such key")
    now = ks.clock()
    if sub == "CONSUMERS":
        g = s.groups.get(args[2])
        if g is None:
            raise NoGroupError(
                f"No such consumer group '{_text(args[2])}' for key name '{_text(args[1])}'"
            )
        return [
            {"name": name, "pending": len(c.pending), "idle": max(0, now - c.seen)}
            for name, c in sorted(g.consumers.items())
        ]
    if sub == "GROUPS":
        return [_group_summary(s, name, g) for name, g in sorted(s.groups.items())]
    return _stream_info(s, args, now)


def _read_counter(g: Group) -> int | None:
    return None if g.entries_read == UNKNOWN else g.entries_read


def _group_summary(s: Stream, name: bytes, g: Group) -> Reply:
    return {
        "name": name,
        "consumers": len(g.consumers),
        "pending": len(g.pel),
        "last-delivered-id": format_id(g.last_id),
        "entries-read": _read_counter(g),
        "lag": s.lag(g),
    }


def _stream_info(s: Stream, args: Sequence[bytes], now: int) -> Reply:
    opts = args[2:]
    full = bool(opts)
    count = 10
    if opts:
        if len(opts) not in (1, 3) or keyword(opts[0]) != "FULL":
            raise _syntax(args[0])
        if len(opts) == 3:
            if keyword(opts[1]) != "COUNT":
                raise _syntax(args[0])
            count = long_arg(opts[2])
            if count < 0:
                count = 10
    out: dict[str | bytes, Reply] = {
        "length": len(s),
        "radix-tree-keys": len(s.nodes),
        "radix-tree-nodes": len(s.nodes) + 1,
        "last-generated-id": format_id(s.last_id),
        "max-deleted-entry-id": format_id(s.max_deleted),
        "entries-added": s.entries_added,
        "recorded-first-entry-id": format_id(s.first_id),
    }
    if not full:
        out["groups"] = len(s.groups)
        out["first-entry"] = entries_reply(s, s.ids[:1])[0] if s.ids else None
        out["last-entry"] = entries_reply(s, s.ids[-1:])[0] if s.ids else None
        return out
    out["entries"] = entries_reply(s, s.ids[:count] if count else s.ids)
    out["groups"] = [_group_full(s, name, g, count) for name, g in sorted(s.groups.items())]
    return out


def _group_full(s: Stream, name: bytes, g: Group, count: int) -> Reply:
    pel = sorted(g.pel)
    shown = pel[:count] if count else pel
    consumers: list[Reply] = []
    for cname, c in sorted(g.consumers.items()):
        own = sorted(c.pending)
        own = own[:count] if count else own
        consumers.append(
            {
                "name": cname,
                "seen-time": c.seen,
                "pel-count": len(c.pending),
                "pending": [[format_id(i), g.pel[i].time, g.pel[i].count] for i in own],
            }
        )
    return {
        "name": name,
        "last-delivered-id": format_id(g.last_id),
        "entries-read": _read_counter(g),
        "lag": s.lag(g),
        "pel-count": len(g.pel),
        "pending": [
            [format_id(i), g.pel[i].consumer, g.pel[i].time, g.pel[i].count] for i in shown
        ],
        "consumers": consumers,
    }


COMMANDS: list[Command] = [
    Command("XINFO", _xinfo, -2, frozenset({"readonly"}), "Stream, group and consumer info"),
]
