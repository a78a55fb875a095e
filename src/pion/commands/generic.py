"""Connection and server commands (docs/protocol.md): PING, ECHO, HELLO, AUTH,
CLIENT, INFO, COMMAND, CONFIG, DBSIZE, TIME, QUIT, SHUTDOWN.

These are what redis-py, redis-cli and redis-benchmark send around the real work, so
each answers the way Redis 7.2 does. The plain keyspace's commands live in ``keys.py``,
``strings.py``, ``hashes.py`` and ``zsets.py``; DBSIZE counts the selected database's
keys, never V-store sessions (SELECT is ``databases.py``'s).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Sequence

from pion import __version__
from pion.commands import config_cmd
from pion.commands.args import Args, parse_int
from pion.commands.clientctl import client_kill, client_no_evict, client_reply, client_unblock
from pion.commands.info import info_command
from pion.commands.pubsub import ping_subscribed
from pion.commands.state import Command, Context
from pion.errors import NoAuthError, NoProtoError, PionError, WrongPassError
from pion.resp.reply import NO_REPLY, Reply, Simple

__all__ = ["COMMANDS", "KEY_POSITIONS"]

log = logging.getLogger("pion.server")

_HELLO_NOAUTH = (
    "HELLO must be called with the client already authenticated, otherwise the HELLO "
    "<proto> AUTH <user> <pass> option can be used to authenticate the client and select "
    "the RESP protocol version at the same time"
)


def _ping(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "PING")
    if len(cur) > 1:
        raise PionError("wrong number of arguments for 'ping' command")
    bare = cur.done()
    message = b"" if bare else cur.arg("message")
    subscribed = ping_subscribed(ctx, message)
    if subscribed is not None:
        return subscribed
    return Simple("PONG") if bare else message


def _echo(ctx: Context, args: Sequence[bytes]) -> Reply:
    return Args(args, "ECHO").arg("message")


def _authenticate(ctx: Context, user: bytes, password: bytes) -> None:
    """Authenticate the connection, or raise and leave it exactly as it was: a wrong
    password never logs out a connection that had authenticated (as in Redis 7)."""
    expected = ctx.state.config.requirepass
    if not expected:
        raise PionError(
            "AUTH <password> called without any password configured for the default "
            "user. Are you sure your configuration is correct?"
        )
    # Only the default user exists; compare in constant time.
    if user != b"default" or not hmac.compare_digest(password, expected.encode("utf-8")):
        raise WrongPassError()
    ctx.client.authenticated = True


def _auth(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "AUTH")
    if len(cur) == 1:
        _authenticate(ctx, b"default", cur.arg("password"))
    elif len(cur) == 2:
        user = cur.arg("username")
        _authenticate(ctx, user, cur.arg("password"))
    else:
        raise PionError("syntax error")
    return Simple("OK")


def _hello(ctx: Context, args: Sequence[bytes]) -> Reply:
    """Redis 7's order: parse every option (a syntax error changes nothing), then
    authenticate, then require authentication, then apply SETNAME and the protocol."""
    cur = Args(args, "HELLO")
    proto = ctx.client.proto
    if not cur.done():
        try:
            proto = parse_int(cur.arg())
        except PionError:
            raise PionError("Protocol version is not an integer or out of range") from None
        if proto not in (2, 3):
            raise NoProtoError()
    name: str | None = None
    credentials: tuple[bytes, bytes] | None = None
    while not cur.done():
        opt = cur.keyword()
        if opt == "AUTH" and len(cur) >= 2:
            credentials = (cur.arg("username"), cur.arg("password"))
        elif opt == "SETNAME" and len(cur) >= 1:
            name = _valid_name(cur.arg())
        else:
            raise PionError(f"Syntax error in HELLO option '{opt or '?'}'")
    if credentials is not None:
        _authenticate(ctx, *credentials)
    if ctx.state.config.auth_required and not ctx.client.authenticated:
        raise NoAuthError(_HELLO_NOAUTH)
    ctx.client.proto = proto
    if name is not None:
        ctx.client.name = name
    return {
        "server": "pion",
        "version": __version__,
        "proto": proto,
        "id": ctx.client.id,
        "mode": "standalone",
        "role": "master",
        "modules": [],
    }


def _printable(raw: bytes) -> bool:
    """Redis's validateClientName/validateClientAttr: only '!'..'~' (no spaces, no
    control bytes, nothing outside ASCII)."""
    return all(0x21 <= c <= 0x7E for c in raw)


def _valid_name(raw: bytes) -> str:
    if not _printable(raw):
        raise PionError("Client names cannot contain spaces, newlines or special characters.")
    return raw.decode("ascii")


def _client_line(ctx: Context, client_id: int) -> str:
    c = ctx.state.clients[client_id]
    age = int(time.time() - c.created)
    subs = ctx.state.pubsub.of(c.id)
    # Redis's pub/sub fields: flags P while subscribed, then the counts per kind.
    counts = (0, 0, 0) if subs is None else tuple(len(n) for n in subs.names)
    flags = "N" if subs is None else "P"
    return (
        f"id={c.id} addr={c.addr} laddr={c.laddr} name={c.name} age={age} flags={flags} db={c.db} "
        f"sub={counts[0]} psub={counts[1]} ssub={counts[2]} "
        f"resp={c.proto} lib-name={c.lib_name} lib-ver={c.lib_ver} cmd={c.last_command.lower()}"
    )


def _client(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "CLIENT")
    sub = cur.keyword()
    if sub == "SETNAME" and len(cur) == 1:
        ctx.client.name = _valid_name(cur.arg())
        return Simple("OK")
    if sub == "GETNAME" and cur.done():
        return ctx.client.name.encode() if ctx.client.name else None
    if sub == "ID" and cur.done():
        return ctx.client.id
    if sub == "SETINFO" and len(cur) == 2:
        raw_attr = cur.arg("attribute")
        attr = raw_attr.decode("utf-8", "replace")[:64]
        value = cur.arg("value")
        upper = attr.upper()
        if upper not in ("LIB-NAME", "LIB-VER"):
            raise PionError(f"Unrecognized option '{attr}'")
        if not _printable(value):
            raise PionError(f"{attr} cannot contain spaces, newlines or special characters.")
        if upper == "LIB-NAME":
            ctx.client.lib_name = value.decode("ascii")
        else:
            ctx.client.lib_ver = value.decode("ascii")
        return Simple("OK")
    if sub == "INFO" and cur.done():
        return _client_line(ctx, ctx.client.id) + "\n"
    if sub == "LIST":
        return "".join(_client_line(ctx, cid) + "\n" for cid in sorted(ctx.state.clients))
    if sub == "KILL":
        return client_kill(ctx, cur)
    if sub == "UNBLOCK":
        return client_unblock(ctx, cur, args[0].decode("ascii"))
    if sub == "NO-EVICT":
        return client_no_evict(ctx, cur)
    if sub == "NO-TOUCH" and len(cur) == 1:
        if cur.keyword() not in ("ON", "OFF"):
            raise PionError("syntax error")
        return Simple("OK")
    if sub == "REPLY":
        return client_reply(ctx, cur)
    raise PionError(
        f"unknown subcommand or wrong number of arguments for '{sub.lower()}'. Try CLIENT HELP."
    )


def _dbsize(ctx: Context, args: Sequence[bytes]) -> Reply:
    return len(ctx.state.keyspace)


def _time(ctx: Context, args: Sequence[bytes]) -> Reply:
    now = time.time()
    return [str(int(now)).encode(), str(int((now % 1) * 1_000_000)).encode()]


def _quit(ctx: Context, args: Sequence[bytes]) -> Reply:
    ctx.client.closing = True
    return Simple("OK")


def _shutdown(ctx: Context, args: Sequence[bytes]) -> Reply:
    save = False
    cur = Args(args, "SHUTDOWN")
    while not cur.done():
        word = cur.keyword()
        if word == "SAVE":
            save = True
        elif word not in ("NOSAVE", "NOW", "FORCE"):
            raise PionError("syntax error")
    if ctx.state.request_shutdown is None:
        raise PionError("SHUTDOWN is not available")
    log.warning("SHUTDOWN requested by %s (save=%s)", ctx.client.addr, save)
    ctx.state.request_shutdown(save)
    ctx.client.closing = True
    return NO_REPLY


def _info(ctx: Context, args: Sequence[bytes]) -> Reply:
    return info_command(ctx, args)


def _command(ctx: Context, args: Sequence[bytes]) -> Reply:
    table = ctx.table
    cur = Args(args, "COMMAND")
    sub = cur.peek_keyword()
    if sub is None:
        return [_command_info(c) for c in table.values()]
    cur.arg()
    if sub == "COUNT":
        return len(table)
    if sub == "INFO":
        names = [a.decode("utf-8", "replace").upper() for a in cur.rest()]
        if not names:
            return [_command_info(c) for c in table.values()]
        return [_command_info(table[n]) if n in table else None for n in names]
    if sub == "DOCS":
        names = [a.decode("utf-8", "replace").upper() for a in cur.rest()] or list(table)
        return {
            n.lower(): {"summary": table[n].summary, "group": "pion"} for n in names if n in table
        }
    if sub == "LIST":
        return [n.lower().encode() for n in table]
    raise PionError(f"unknown subcommand '{sub.lower()}'. Try COMMAND HELP.")


# The key positions (first key, last key, step) of the commands that take keys of the
# plain keyspace, as redis-server 7 reports them (a test compares the two; Redis 7.4's
# for hash-field expiry, HEXPIRE and its family, which 7.0 lacks); every other
# command has none: its arguments are namespaces, session ids or options (shard
# channels count as keys, as in Redis: they pick a cluster slot). One line per
# command: a keyspace command added to the table adds its line here.
KEY_POSITIONS: dict[str, tuple[int, int, int]] = {
    "APPEND": (1, 1, 1),
    "BITCOUNT": (1, 1, 1),
    "BITFIELD": (1, 1, 1),
    "BITFIELD_RO": (1, 1, 1),
    "BITOP": (2, -1, 1),
    "BITPOS": (1, 1, 1),
    "BLMOVE": (1, 2, 1),
    "BLPOP": (1, -2, 1),
    "BRPOP": (1, -2, 1),
    "BRPOPLPUSH": (1, 2, 1),
    "BZPOPMAX": (1, -2, 1),
    "BZPOPMIN": (1, -2, 1),
    "COPY": (1, 2, 1),
    "DECR": (1, 1, 1),
    "DECRBY": (1, 1, 1),
    "DEL": (1, -1, 1),
    "DUMP": (1, 1, 1),
    "EXISTS": (1, -1, 1),
    "EXPIRE": (1, 1, 1),
    "EXPIREAT": (1, 1, 1),
    "EXPIRETIME": (1, 1, 1),
    "GEOADD": (1, 1, 1),
    "GEODIST": (1, 1, 1),
    "GEOHASH": (1, 1, 1),
    "GEOPOS": (1, 1, 1),
    "GEORADIUS": (1, 1, 1),
    "GEORADIUSBYMEMBER": (1, 1, 1),
    "GEORADIUSBYMEMBER_RO": (1, 1, 1),
    "GEORADIUS_RO": (1, 1, 1),
    "GEOSEARCH": (1, 1, 1),
    "GEOSEARCHSTORE": (1, 2, 1),
    "GET": (1, 1, 1),
    "GETBIT": (1, 1, 1),
    "GETDEL": (1, 1, 1),
    "GETEX": (1, 1, 1),
    "GETRANGE": (1, 1, 1),
    "GETSET": (1, 1, 1),
    "HDEL": (1, 1, 1),
    "HEXISTS": (1, 1, 1),
    "HEXPIRE": (1, 1, 1),
    "HEXPIREAT": (1, 1, 1),
    "HEXPIRETIME": (1, 1, 1),
    "HGET": (1, 1, 1),
    "HGETALL": (1, 1, 1),
    "HINCRBY": (1, 1, 1),
    "HINCRBYFLOAT": (1, 1, 1),
    "HKEYS": (1, 1, 1),
    "HLEN": (1, 1, 1),
    "HMGET": (1, 1, 1),
    "HMSET": (1, 1, 1),
    "HPERSIST": (1, 1, 1),
    "HPEXPIRE": (1, 1, 1),
    "HPEXPIREAT": (1, 1, 1),
    "HPEXPIRETIME": (1, 1, 1),
    "HPTTL": (1, 1, 1),
    "HRANDFIELD": (1, 1, 1),
    "HSCAN": (1, 1, 1),
    "HSET": (1, 1, 1),
    "HSETNX": (1, 1, 1),
    "HSTRLEN": (1, 1, 1),
    "HTTL": (1, 1, 1),
    "HVALS": (1, 1, 1),
    "INCR": (1, 1, 1),
    "INCRBY": (1, 1, 1),
    "INCRBYFLOAT": (1, 1, 1),
    "LCS": (1, 2, 1),
    "LINDEX": (1, 1, 1),
    "LINSERT": (1, 1, 1),
    "LLEN": (1, 1, 1),
    "LMOVE": (1, 2, 1),
    "LPOP": (1, 1, 1),
    "LPOS": (1, 1, 1),
    "LPUSH": (1, 1, 1),
    "LPUSHX": (1, 1, 1),
    "LRANGE": (1, 1, 1),
    "LREM": (1, 1, 1),
    "LSET": (1, 1, 1),
    "LTRIM": (1, 1, 1),
    "MOVE": (1, 1, 1),
    "MGET": (1, -1, 1),
    "MSET": (1, -1, 2),
    "MSETNX": (1, -1, 2),
    "PERSIST": (1, 1, 1),
    "PEXPIRE": (1, 1, 1),
    "PEXPIREAT": (1, 1, 1),
    "PEXPIRETIME": (1, 1, 1),
    "PFADD": (1, 1, 1),
    "PFCOUNT": (1, -1, 1),
    "PFMERGE": (1, -1, 1),
    "PSETEX": (1, 1, 1),
    "PTTL": (1, 1, 1),
    "RENAME": (1, 2, 1),
    "RENAMENX": (1, 2, 1),
    "RESTORE": (1, 1, 1),
    "RPOP": (1, 1, 1),
    "RPOPLPUSH": (1, 2, 1),
    "RPUSH": (1, 1, 1),
    "RPUSHX": (1, 1, 1),
    "SADD": (1, 1, 1),
    "SCARD": (1, 1, 1),
    "SDIFF": (1, -1, 1),
    "SDIFFSTORE": (1, -1, 1),
    "SET": (1, 1, 1),
    "SETBIT": (1, 1, 1),
    "SETEX": (1, 1, 1),
    "SETNX": (1, 1, 1),
    "SETRANGE": (1, 1, 1),
    "SINTER": (1, -1, 1),
    "SINTERSTORE": (1, -1, 1),
    "SISMEMBER": (1, 1, 1),
    "SMEMBERS": (1, 1, 1),
    "SMISMEMBER": (1, 1, 1),
    "SMOVE": (1, 2, 1),
    "SORT": (1, 1, 1),
    "SORT_RO": (1, 1, 1),
    "SPOP": (1, 1, 1),
    "SPUBLISH": (1, 1, 1),
    "SRANDMEMBER": (1, 1, 1),
    "SREM": (1, 1, 1),
    "SSCAN": (1, 1, 1),
    "SSUBSCRIBE": (1, -1, 1),
    "STRLEN": (1, 1, 1),
    "SUBSTR": (1, 1, 1),
    "SUNION": (1, -1, 1),
    "SUNIONSTORE": (1, -1, 1),
    "SUNSUBSCRIBE": (1, -1, 1),
    "TOUCH": (1, -1, 1),
    "TTL": (1, 1, 1),
    "TYPE": (1, 1, 1),
    "UNLINK": (1, -1, 1),
    "WATCH": (1, -1, 1),
    "XACK": (1, 1, 1),
    "XADD": (1, 1, 1),
    "XAUTOCLAIM": (1, 1, 1),
    "XCLAIM": (1, 1, 1),
    "XDEL": (1, 1, 1),
    "XLEN": (1, 1, 1),
    "XPENDING": (1, 1, 1),
    "XRANGE": (1, 1, 1),
    "XREVRANGE": (1, 1, 1),
    "XSETID": (1, 1, 1),
    "XTRIM": (1, 1, 1),
    "ZADD": (1, 1, 1),
    "ZCARD": (1, 1, 1),
    "ZCOUNT": (1, 1, 1),
    "ZDIFFSTORE": (1, 1, 1),
    "ZINCRBY": (1, 1, 1),
    "ZINTERSTORE": (1, 1, 1),
    "ZLEXCOUNT": (1, 1, 1),
    "ZMSCORE": (1, 1, 1),
    "ZPOPMAX": (1, 1, 1),
    "ZPOPMIN": (1, 1, 1),
    "ZRANDMEMBER": (1, 1, 1),
    "ZRANGE": (1, 1, 1),
    "ZRANGEBYLEX": (1, 1, 1),
    "ZRANGEBYSCORE": (1, 1, 1),
    "ZRANGESTORE": (1, 2, 1),
    "ZRANK": (1, 1, 1),
    "ZREM": (1, 1, 1),
    "ZREMRANGEBYLEX": (1, 1, 1),
    "ZREMRANGEBYRANK": (1, 1, 1),
    "ZREMRANGEBYSCORE": (1, 1, 1),
    "ZREVRANGE": (1, 1, 1),
    "ZREVRANGEBYLEX": (1, 1, 1),
    "ZREVRANGEBYSCORE": (1, 1, 1),
    "ZREVRANK": (1, 1, 1),
    "ZSCAN": (1, 1, 1),
    "ZSCORE": (1, 1, 1),
    "ZUNIONSTORE": (1, 1, 1),
}


def _command_info(cmd: Command) -> Reply:
    """Redis 7's COMMAND entry: name, arity, flags, first/last key and step
    (:data:`KEY_POSITIONS`; 0, 0, 0 for the commands without keyspace keys), ACL
    categories, tips, key specs, subcommands. redis-py's RESP3 parser reads all ten."""
    flags: list[Reply] = [Simple(f) for f in sorted(cmd.flags)]
    categories: list[Reply] = [Simple("@pion")]
    first, last, step = KEY_POSITIONS.get(cmd.name, (0, 0, 0))
    name = cmd.name.lower().encode()
    return [name, cmd.arity, flags, first, last, step, categories, [], [], []]


_ANY = frozenset({"noauth", "loading", "fast"})

COMMANDS: list[Command] = [
    Command("PING", _ping, -1, frozenset({"fast"}), "Ping the server"),
    Command("ECHO", _echo, 2, frozenset({"fast"}), "Echo the argument"),
    Command("HELLO", _hello, -1, _ANY, "Handshake: protocol version, AUTH, SETNAME"),
    Command("AUTH", _auth, -2, _ANY, "Authenticate the connection"),
    Command("CLIENT", _client, -2, frozenset({"loading"}), "Connection introspection"),
    Command("INFO", _info, -1, frozenset({"loading"}), "Server information by section"),
    Command("COMMAND", _command, -1, frozenset({"loading"}), "Command table introspection"),
    Command(
        "CONFIG", config_cmd.config, -2, frozenset({"admin", "loading"}), "CONFIG GET|SET|RESETSTAT"
    ),
    Command("DBSIZE", _dbsize, 1, frozenset({"fast", "readonly"}), "Keys in the plain keyspace"),
    Command("TIME", _time, 1, frozenset({"fast", "loading"}), "Server time"),
    Command("QUIT", _quit, -1, _ANY, "Close the connection"),
    Command("SHUTDOWN", _shutdown, -1, frozenset({"admin", "loading"}), "Stop the server"),
]
