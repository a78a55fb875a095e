"""Every command redis-py's ``Redis`` class sends for the families Pion serves (strings
and generic keys, hashes, sorted sets, geo, lists, sets, streams, SCAN, functions, and the server
and connection commands) is either served by pion-server or listed in docs/protocol.md
"Not yet served" with its reason, and answers ``-ERR unknown command`` there: nothing
is half-served.

The list is read from redis-py's own source (its command mixins), so a redis-py release
that sends a new command fails this test until the command is served or listed.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

from redis.commands import core

from pion.server.run import ServerThread
from support.keyspace import Err, RawClient

_FAMILIES = (
    core.BasicKeyCommands,
    core.HashCommands,
    core.SortedSetCommands,
    core.GeoCommands,
    core.ListCommands,
    core.SetCommands,
    core.ScanCommands,
    core.StreamCommands,
    core.ManagementCommands,
    core.FunctionCommands,
)
_NAME = re.compile(r"^[A-Z][A-Z0-9_]*(?: [A-Z][A-Z0-9_-]*)?$")
# Option words redis-py appends after the command name (not commands).
_OPTIONS = frozenset(
    {
        "COUNT",
        "DB",
        "DURATION",
        "ENTRIESREAD",
        "IDLE",
        "IFDEQ",
        "IFDNE",
        "IFEQ",
        "IFNE",
        "LIMIT",
        "MAXLEN",
        "RANK",
        "METRICS",
        "MINMATCHLEN",
        "OFF",
        "ON",
        "PATTERN",
        "PREFIX",
        "REDIRECT",
        "SAMPLE",
        "SUM",
        "ACLCAT",
        "LIBRARYNAME",
        "REPLACE",
        "WITHCODE",
    }
)

# Not served, each in docs/protocol.md "Not yet served" (the reasons are there).
NOT_SERVED = frozenset(
    {
        # Redis 8 additions to lists and sets (not in Redis 7.x)
        "BLMOVEM",
        "LMOVEM",
        "SDIFFCARD",
        "SUNIONCARD",
        # string algorithms (Redis 7.0 removed it; LCS is served)
        "STRALGO",
        # Redis's own servers
        "MIGRATE",
        # Redis 8 additions
        "XACKDEL",
        "XCFGSET",
        "XDELEX",
        "XNACK",
        "DELEX",
        "DIGEST",
        "INCREX",
        "MSETEX",
        # Redis 8.0's hash commands (hash-field expiry itself, Redis 7.4's, is served)
        "HGETDEL",
        "HGETEX",
        "HSETEX",
        "HOTKEYS",
        # replication, Redis's persistence commands, debugging, modules
        "BGREWRITEAOF",
        "BGSAVE",
        "SAVE",
        "LASTSAVE",
        "PSYNC",
        "SYNC",
        "REPLICAOF",
        "SLAVEOF",
        "ROLE",
        "WAITAOF",
        "DEBUG",
        "LATENCY",
        "LOLWUT",
        "MODULE",
        "RESET",
        # subcommands of served commands
        "CLIENT GETREDIR",
        "CLIENT PAUSE",
        "CLIENT UNPAUSE",
        "CLIENT TRACKING",
        "CLIENT TRACKINGINFO",
        "CONFIG REWRITE",
        "COMMAND GETKEYSANDFLAGS",
        "MEMORY MALLOC-STATS",
        "MEMORY PURGE",
    }
)

# A valid call of each served subcommand (the subcommand must not be refused as
# unknown).
SUBCOMMAND_CALLS: dict[str, list[str]] = {
    "CLIENT GETNAME": ["CLIENT", "GETNAME"],
    "CLIENT ID": ["CLIENT", "ID"],
    "CLIENT INFO": ["CLIENT", "INFO"],
    "CLIENT KILL": ["CLIENT", "KILL", "ID", "999999"],
    "CLIENT LIST": ["CLIENT", "LIST"],
    "CLIENT NO-EVICT": ["CLIENT", "NO-EVICT", "OFF"],
    "CLIENT NO-TOUCH": ["CLIENT", "NO-TOUCH", "OFF"],
    "CLIENT REPLY": ["CLIENT", "REPLY", "ON"],
    "CLIENT SETINFO": ["CLIENT", "SETINFO", "LIB-NAME", "test"],
    "CLIENT SETNAME": ["CLIENT", "SETNAME", "test"],
    "CLIENT UNBLOCK": ["CLIENT", "UNBLOCK", "999999"],
    "COMMAND COUNT": ["COMMAND", "COUNT"],
    "COMMAND LIST": ["COMMAND", "LIST"],
    "CONFIG GET": ["CONFIG", "GET", "maxclients"],
    "CONFIG SET": ["CONFIG", "SET", "slowlog-max-len", "128"],
    "CONFIG RESETSTAT": ["CONFIG", "RESETSTAT"],
    "LOLWUT VERSION": [],  # LOLWUT is not served at all
    "MEMORY STATS": ["MEMORY", "STATS"],
    "MEMORY USAGE": ["MEMORY", "USAGE", "k"],
    "SLOWLOG GET": ["SLOWLOG", "GET"],
    "SLOWLOG LEN": ["SLOWLOG", "LEN"],
    "SLOWLOG RESET": ["SLOWLOG", "RESET"],
    "HOTKEYS GET": [],  # HOTKEYS is not served at all
    "HOTKEYS RESET": [],
    "HOTKEYS STOP": [],
    "LATENCY HISTORY": [],  # LATENCY is not served at all
    "LATENCY LATEST": [],
    "LATENCY RESET": [],
    "DEBUG OBJECT": [],  # DEBUG is not served at all
    "FUNCTION DELETE": ["FUNCTION", "DELETE", "nosuch"],
    "FUNCTION DUMP": ["FUNCTION", "DUMP"],
    "FUNCTION KILL": ["FUNCTION", "KILL"],
    "FUNCTION LIST": ["FUNCTION", "LIST"],
    "FUNCTION LOAD": [
        "FUNCTION",
        "LOAD",
        "#!lua name=l\nredis.register_function('f', function() end)",
    ],
    "FUNCTION RESTORE": ["FUNCTION", "RESTORE", "\xf5"],
    "FUNCTION STATS": ["FUNCTION", "STATS"],
    "FUNCTION FLUSH": ["FUNCTION", "FLUSH"],  # after LOAD: leaves no library behind
    "XGROUP CREATE": ["XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"],
    "XGROUP CREATECONSUMER": ["XGROUP", "CREATECONSUMER", "s", "g", "c"],
    "XGROUP DELCONSUMER": ["XGROUP", "DELCONSUMER", "s", "g", "c"],
    "XGROUP DESTROY": ["XGROUP", "DESTROY", "s", "g"],
    "XGROUP SETID": ["XGROUP", "SETID", "s", "g", "0"],
    "XINFO CONSUMERS": ["XINFO", "CONSUMERS", "s", "g"],
    "XINFO GROUPS": ["XINFO", "GROUPS", "s"],
    "XINFO STREAM": ["XINFO", "STREAM", "s"],
}
# Never sent bare: they end the connection or the server (COMMAND INFO vouches).
_NOT_SENT_BARE = frozenset({"QUIT", "SHUTDOWN"})


def _sent_by(cls: type) -> set[str]:
    """Command names (and "COMMAND SUB" pairs) a mixin's methods send."""
    out: set[str] = set()
    for fn in vars(cls).values():
        if not callable(fn):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            first: ast.expr | None = None
            if isinstance(node, ast.Call) and node.args:
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name == "execute_command" or name.startswith("_"):
                    first = node.args[0]
            elif isinstance(node, ast.List) and node.elts:
                first = node.elts[0]
            if (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and _NAME.match(first.value)
                and first.value not in _OPTIONS
            ):
                out.add(first.value)
    return out


def _sent() -> set[str]:
    names: set[str] = set()
    for cls in _FAMILIES:
        names |= _sent_by(cls)
    return names


def _not_served_section() -> str:
    text = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
    start = text.index("\n## Not yet served")
    return text[start : text.index("\n## ", start + 1)]


def test_redis_py_sends_what_this_test_classifies() -> None:
    names = _sent()
    assert {"SET", "HINCRBYFLOAT", "ZPOPMIN", "SLOWLOG GET", "MEMORY USAGE"} <= names
    top = {n for n in names if " " not in n}
    subs = {n for n in names if " " in n}
    unclassified = {s for s in subs if s not in SUBCOMMAND_CALLS and s not in NOT_SERVED}
    assert not unclassified, f"classify these subcommands: {sorted(unclassified)}"
    assert top  # sanity: the source was read


def test_every_command_redis_py_sends_is_served_or_listed(server: ServerThread) -> None:
    c = RawClient(server.port)
    section = _not_served_section()
    names = _sent()
    served = sorted(n for n in names if " " not in n and n not in NOT_SERVED)
    for name in served:
        info = c.call("COMMAND", "INFO", name).value
        assert info != [None], f"{name}: not in the command table"
        if name in _NOT_SENT_BARE:
            continue
        reply = c.call(name).value
        if isinstance(reply, Err):
            assert not reply.line.startswith(b"ERR unknown command"), (name, reply)
    for pair, call in SUBCOMMAND_CALLS.items():
        if call and pair in names:
            reply = c.call(*call).value
            bad = isinstance(reply, Err) and b"unknown subcommand" in reply.line
            assert not bad, (pair, reply)
    for name in sorted(NOT_SERVED):
        assert f"`{name}`" in section, f"{name} is not listed in docs/protocol.md"
        if " " not in name:
            reply = c.call(name, "x").value
            assert isinstance(reply, Err) and reply.line.startswith(b"ERR unknown command"), name
        else:
            reply = c.call(*name.split(), "x").value
            assert isinstance(reply, Err), name
    c.close()
