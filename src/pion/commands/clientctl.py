"""The CLIENT subcommands that act on connections: REPLY, KILL, NO-EVICT
(docs/protocol.md, "CLIENT"), with Redis 7.0's replies and error texts. The other
CLIENT subcommands are ``generic.py``'s, which hands these three here.

CLIENT REPLY is a per-client mode (``ClientState.reply_mode``): ``off`` silences every
reply until ``CLIENT REPLY ON``; ``skip`` silences the next command's. The dispatcher
(:func:`pion.server.dispatch.execute`) runs a silenced client's commands to the end and
asks :func:`begin_silent` and :func:`silenced` whether the reply goes out. OFF and SKIP
themselves never answer; ON answers ``+OK``. SKIP while replies are off changes
nothing, as in Redis.
"""

from __future__ import annotations

from pion.commands.args import Args
from pion.commands.blocking import unblock
from pion.commands.state import ClientState, Context
from pion.errors import PionError
from pion.keyspace.numbers import parse_int64
from pion.resp.reply import NO_REPLY, Reply, Simple

__all__ = ["begin_silent", "client_kill", "client_no_evict", "client_reply", "silenced"]

# Redis's client types; a Pion connection is a pubsub one while it has a subscription
# (pion.pubsub), else a normal one.
_TYPES = frozenset({"NORMAL", "MASTER", "REPLICA", "SLAVE", "PUBSUB"})


def _arity(sub: str) -> PionError:
    return PionError(f"wrong number of arguments for 'client|{sub}' command")


# -- CLIENT REPLY ---------------------------------------------------------------------------


def client_reply(ctx: Context, cur: Args) -> Reply:
    if len(cur) != 1:
        raise _arity("reply")
    mode = cur.keyword()
    client = ctx.client
    if mode == "ON":
        client.reply_mode = "on"
        return Simple("OK")
    if mode == "OFF":
        client.reply_mode = "off"
        return NO_REPLY
    if mode == "SKIP":
        if client.reply_mode != "off":
            client.reply_mode = "skip"
        return NO_REPLY
    raise PionError("syntax error")


def begin_silent(client: ClientState) -> None:
    """Before a silenced client's command: a pending SKIP is consumed by it."""
    if client.reply_mode == "skip":
        client.reply_mode = "skipping"


def silenced(client: ClientState) -> bool:
    """After that command: True when its reply is dropped (the command did not switch
    replies back on)."""
    mode = client.reply_mode
    if mode == "skipping":
        client.reply_mode = "on"
        return True
    return mode != "on"


# -- CLIENT NO-EVICT ------------------------------------------------------------------------


def client_no_evict(ctx: Context, cur: Args) -> Reply:
    if len(cur) != 1:
        raise _arity("no-evict")
    flag = cur.keyword()
    if flag not in ("ON", "OFF"):
        raise PionError("syntax error")
    ctx.client.no_evict = flag == "ON"  # exempt from the maxmemory-clients bound
    return Simple("OK")


# -- CLIENT UNBLOCK ------------------------------------------------------------------------


def client_unblock(ctx: Context, cur: Args, spelled: str) -> Reply:
    """``CLIENT UNBLOCK id [TIMEOUT|ERROR]``: ``:1`` when client ``id`` was waiting in
    a blocking command (now answered as timed out, or ``-UNBLOCKED ...``), else ``:0``.
    ``spelled``: the subcommand as sent, which Redis's arity error quotes."""
    if len(cur) not in (1, 2):
        raise PionError(
            f"unknown subcommand or wrong number of arguments for '{spelled}'. Try CLIENT HELP."
        )
    client_id = parse_int64(cur.arg())
    if client_id is None:
        raise PionError("value is not an integer or out of range")
    error = False
    if not cur.done():
        reason = cur.keyword()
        if reason not in ("TIMEOUT", "ERROR"):
            raise PionError("CLIENT UNBLOCK reason should be TIMEOUT or ERROR")
        error = reason == "ERROR"
    return int(unblock(ctx.state.databases, client_id, error))


# -- CLIENT KILL ----------------------------------------------------------------------------


def client_kill(ctx: Context, cur: Args) -> Reply:
    """``CLIENT KILL addr:port`` (+OK or ``No such client``; may kill the caller), or
    filters ``ID``, ``TYPE``, ``ADDR``, ``LADDR``, ``USER``, ``SKIPME``: every
    connection matching all of them is closed (the caller only with ``SKIPME no``);
    the reply counts them. Every filter is checked before any connection is closed."""
    if len(cur) == 0:
        raise _arity("kill")
    state = ctx.state
    if len(cur) == 1:
        addr = cur.arg("addr").decode("utf-8", "replace")
        for cid, c in list(state.clients.items()):
            if c.addr == addr:
                _close(ctx, cid)
                return Simple("OK")
        raise PionError("No such client")
    ids: int | None = None
    kind: str | None = None
    addr_f: str | None = None
    laddr_f: str | None = None
    skipme = True
    while not cur.done():
        if len(cur) < 2:
            raise PionError("syntax error")
        opt = cur.keyword()
        value = cur.arg(opt.lower())
        text = value.decode("utf-8", "replace")
        if opt == "ID":
            ids = _client_id(value)
        elif opt == "TYPE":
            if text.upper() not in _TYPES:
                raise PionError(f"Unknown client type '{text}'")
            kind = text.upper()
        elif opt == "ADDR":
            addr_f = text
        elif opt == "LADDR":
            laddr_f = text
        elif opt == "USER":
            if text != "default":  # Pion has one user, Redis's default
                raise PionError(f"No such user '{text}'")
        elif opt == "SKIPME":
            if text.lower() not in ("yes", "no"):
                raise PionError("syntax error")
            skipme = text.lower() == "yes"
        else:
            raise PionError("syntax error")
    if kind is not None and kind not in ("NORMAL", "PUBSUB"):
        return 0
    killed = 0
    for cid, c in list(state.clients.items()):
        if (
            (kind is not None and (kind == "PUBSUB") != state.pubsub.subscribed(cid))
            or (ids is not None and cid != ids)
            or (addr_f is not None and c.addr != addr_f)
            or (laddr_f is not None and c.laddr != laddr_f)
            or (skipme and cid == ctx.client.id)
        ):
            continue
        if _close(ctx, cid):
            killed += 1
    return killed


def _client_id(raw: bytes) -> int:
    digits = raw[1:] if raw.startswith(b"-") else raw
    value = int(raw) if digits.isdigit() and len(raw) <= 20 else 0
    if value <= 0:
        raise PionError("client-id should be greater than 0")
    return value


def _close(ctx: Context, cid: int) -> bool:
    """Close connection ``cid``; the caller's own after this reply, as Redis does."""
    if cid == ctx.client.id:
        ctx.client.closing = True
        return True
    kill = ctx.state.kill_client
    if kill is None:
        raise PionError("CLIENT KILL is not available")
    return kill(cid)
