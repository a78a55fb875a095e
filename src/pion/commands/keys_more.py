"""More generic key commands: RENAME, RENAMENX, COPY, RANDOMKEY, TOUCH, OBJECT
ENCODING|FREQ|IDLETIME|REFCOUNT|HELP, with Redis 7.0's replies and error texts.

COPY's ``DB`` option copies into another database (``Keyspace.copy_to``), its index
checked as SELECT checks one (``databases.py``).

OBJECT ENCODING names what Redis 7.0 would use for a value of this shape: a string is
``int`` (an integer Redis's ``string2l`` reads, at most 20 bytes), ``embstr`` (at most
44 bytes) or ``raw``; a hash ``listpack`` or ``hashtable``, a sorted set ``listpack`` or
``skiplist``, by Redis's listpack limits (512 fields, 128 members, of at most 64 bytes
each). Redis
decides when a value is built and never converts back, so after APPEND or SETRANGE (it
keeps those as ``raw``) or after a large hash shrank, Redis's answer can differ; Pion
stores every value one way and the encoding is only a report.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from pion.commands.databases import db_index
from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.keyspace.entries import Value
from pion.keyspace.hashes import compact as compact_hash
from pion.keyspace.numbers import parse_int64
from pion.keyspace.sets import encoding as set_encoding
from pion.keyspace.streamtype import Stream
from pion.keyspace.zsets_more import compact as compact_zset
from pion.notify import GENERIC, notify
from pion.resp.reply import Reply, Simple

__all__ = ["COMMANDS", "encoding_of"]

# Redis's OBJ_ENCODING_EMBSTR_SIZE_LIMIT.
_EMBSTR_LIMIT = 44
_LFU_ERROR = (
    "An LFU maxmemory policy is not selected, access frequency not tracked. Please note "
    "that when switching between policies at runtime LRU and LFU data will take some "
    "time to adjust."
)
_OBJECT_HELP = [
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
]


def encoding_of(value: Value) -> str:
    if isinstance(value, deque):
        return "quicklist"  # Redis 7.0's only list encoding
    if isinstance(value, Stream):
        return "stream"
    if isinstance(value, set):
        return set_encoding(value)
    if isinstance(value, bytes):
        if len(value) <= 20 and parse_int64(value) is not None:
            return "int"
        return "embstr" if len(value) <= _EMBSTR_LIMIT else "raw"
    if isinstance(value, dict):
        return "listpack" if compact_hash(value) else "hashtable"
    return "listpack" if compact_zset(value) else "skiplist"


def _rename(ctx: Context, args: Sequence[bytes]) -> Reply:
    if not ctx.state.keyspace.rename(args[0], args[1]):
        raise PionError("no such key")
    _renamed(ctx, args[0], args[1])
    return Simple("OK")


def _renamed(ctx: Context, source: bytes, destination: bytes) -> None:
    if source != destination:  # Redis: renaming a key to itself notifies nothing
        notify(ctx.state, GENERIC, "rename_from", source)
        notify(ctx.state, GENERIC, "rename_to", destination)


def _renamenx(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    if not ks.exists(args[0]):
        raise PionError("no such key")
    if args[0] == args[1] or ks.exists(args[1]):
        return 0
    ks.rename(args[0], args[1])
    _renamed(ctx, args[0], args[1])
    return 1


def _copy(ctx: Context, args: Sequence[bytes]) -> Reply:
    replace = False
    source = target = ctx.state.keyspace
    i = 2
    while i < len(args):
        word = args[i].upper()
        if word == b"REPLACE":
            replace = True
        elif word == b"DB" and i + 1 < len(args):
            target = ctx.state.databases[db_index(ctx, args[i + 1])]
            i += 1
        else:
            raise PionError("syntax error")
        i += 1
    if target is source and args[0] == args[1]:
        raise PionError("source and destination objects are the same")
    if target is source:
        copied = source.copy(args[0], args[1], replace)
    else:
        copied = source.copy_to(args[0], args[1], target, replace)
    if copied:
        notify(ctx.state, GENERIC, "copy_to", args[1], target.db)
    return int(copied)


def _randomkey(ctx: Context, args: Sequence[bytes]) -> Reply:
    return ctx.state.keyspace.random_key()


def _touch(ctx: Context, args: Sequence[bytes]) -> Reply:
    ks = ctx.state.keyspace
    return sum(ks.exists(k) for k in args)  # a lookup marks the key used (IDLETIME 0)


def _object(ctx: Context, args: Sequence[bytes]) -> Reply:
    sub = args[0].decode("utf-8", "replace")
    upper = sub.upper()
    if upper not in ("ENCODING", "FREQ", "IDLETIME", "REFCOUNT", "HELP"):
        raise PionError(f"unknown subcommand '{sub[:128]}'. Try OBJECT HELP.")
    if len(args) != (1 if upper == "HELP" else 2):
        raise PionError(f"wrong number of arguments for 'object|{sub.lower()}' command")
    if upper == "HELP":
        return [Simple(line) for line in _OBJECT_HELP]
    ks = ctx.state.keyspace
    e = ks.peek(args[1])
    if e is None:
        return None
    if upper == "ENCODING":
        encoding = encoding_of(e.value)
        if encoding == "listpack" and ks.field_ttls.of(args[1]):
            encoding = "listpackex"  # Redis 7.4's small hash with field deadlines
        return encoding.encode()
    if upper == "FREQ":
        raise PionError(_LFU_ERROR)  # no LFU policy can be selected (commands/budget.py)
    if upper == "IDLETIME":
        return max(0, ks.clock() // 1000 - e.touched)
    return 1  # every value is held once, by its key


COMMANDS: list[Command] = [
    Command("RENAME", _rename, 3, frozenset({"write"}), "Rename a key"),
    Command("RENAMENX", _renamenx, 3, frozenset({"write", "fast"}), "Rename unless taken"),
    Command("COPY", _copy, -3, frozenset({"write"}), "Copy a key's value"),
    Command("TOUCH", _touch, -2, frozenset({"readonly", "fast"}), "Mark keys used; count them"),
    Command("RANDOMKEY", _randomkey, 1, frozenset({"readonly"}), "A random key"),
    Command("OBJECT", _object, -2, frozenset({"readonly"}), "ENCODING|FREQ|IDLETIME|REFCOUNT"),
]
