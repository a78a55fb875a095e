"""Pub/sub commands (docs/protocol.md, "Pub/sub"): SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE,
PUNSUBSCRIBE, SSUBSCRIBE, SUNSUBSCRIBE, PUBLISH, SPUBLISH and PUBSUB, over the
worker's registry (``pion.pubsub``).

The confirmations of a (un)subscribe are one array per name, as Redis sends them
(pushes in RESP3), so a handler returns them already encoded. A RESP2 client with a
subscription is in subscribed mode: :func:`refuse_subscribed` is the check dispatch
runs for it, with Redis's error.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.state import Command, Context
from pion.errors import PionError
from pion.pubsub import SUBSCRIBE_NAMES, UNSUBSCRIBE_NAMES, Kind, bulk, header
from pion.resp.reply import Encoded, Reply, Simple

__all__ = ["COMMANDS", "ping_subscribed", "refuse_subscribed"]

# What a RESP2 client in subscribed mode may still send (Redis's list).
_ALLOWED = frozenset(
    {
        "SUBSCRIBE",
        "PSUBSCRIBE",
        "SSUBSCRIBE",
        "UNSUBSCRIBE",
        "PUNSUBSCRIBE",
        "SUNSUBSCRIBE",
        "PING",
        "QUIT",
        "RESET",
    }
)
# Commands with subcommands: Redis names the refused one ``container|sub``.
_CONTAINERS = frozenset(
    {"CLIENT", "CONFIG", "COMMAND", "PUBSUB", "OBJECT", "MEMORY", "SLOWLOG", "ACL", "LATENCY"}
)
_PUBSUB_SUBCOMMANDS = frozenset(
    {"CHANNELS", "NUMPAT", "NUMSUB", "SHARDCHANNELS", "SHARDNUMSUB", "HELP"}
)


def refuse_subscribed(ctx: Context, cmd: Command, argv: Sequence[bytes]) -> None:
    """Raise Redis's error for a command a RESP2 subscriber may not run."""
    client = ctx.client
    if client.proto != 2 or cmd.name in _ALLOWED or not ctx.state.pubsub.subscribed(client.id):
        return
    name = cmd.name.lower()
    if cmd.name in _CONTAINERS and len(argv) > 1:
        sub = argv[1].decode("utf-8", "replace").lower()
        if cmd.name == "PUBSUB" and sub.upper() not in _PUBSUB_SUBCOMMANDS:
            return  # Redis answers the unknown subcommand first (the handler's error)
        name += "|" + sub
    raise PionError(
        f"Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / "
        "RESET are allowed in this context"
    )


def ping_subscribed(ctx: Context, message: bytes) -> Reply | None:
    """PING's reply in RESP2 subscribed mode (``pong`` and the message, an array), or
    None where PING answers as usual."""
    client = ctx.client
    if client.proto != 2 or not ctx.state.pubsub.subscribed(client.id):
        return None
    return Encoded(b"*2\r\n$4\r\npong\r\n" + bulk(message))


def _confirm(proto: int, what: bytes, name: bytes | None, count: int) -> bytes:
    null = (b"_\r\n" if proto == 3 else b"$-1\r\n") if name is None else bulk(name)
    return header(proto, 3) + bulk(what) + null + b":%d\r\n" % count


def _subscriber(kind: Kind) -> Command:
    what = SUBSCRIBE_NAMES[kind]

    def handler(ctx: Context, args: Sequence[bytes]) -> Reply:
        client = ctx.client
        if client.push is None:
            raise PionError("pub/sub is served on RESP connections only")
        pubsub = ctx.state.pubsub
        out = [
            _confirm(client.proto, what, name, pubsub.subscribe(kind, client, name))
            for name in args
        ]
        return Encoded(b"".join(out))

    name = what.decode().upper()
    return Command(name, handler, -2, frozenset({"loading", "fast"}), f"Subscribe ({name})")


def _unsubscriber(kind: Kind) -> Command:
    what = UNSUBSCRIBE_NAMES[kind]

    def handler(ctx: Context, args: Sequence[bytes]) -> Reply:
        client = ctx.client
        pubsub = ctx.state.pubsub
        names = list(args) if args else pubsub.names(kind, client.id)
        if not names:
            subs = pubsub.of(client.id)
            left = 0 if subs is None else subs.count(kind)
            return Encoded(_confirm(client.proto, what, None, left))
        out = [
            _confirm(client.proto, what, name, pubsub.unsubscribe(kind, client.id, name))
            for name in names
        ]
        return Encoded(b"".join(out))

    name = what.decode().upper()
    return Command(name, handler, -1, frozenset({"loading", "fast"}), f"Unsubscribe ({name})")


def _publish(ctx: Context, args: Sequence[bytes]) -> Reply:
    return ctx.state.pubsub.publish(args[0], args[1])


def _spublish(ctx: Context, args: Sequence[bytes]) -> Reply:
    return ctx.state.pubsub.spublish(args[0], args[1])


_HELP = [
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Return the currently active channels matching a <pattern> (default: '*').",
    "NUMPAT",
    "    Return number of subscriptions to patterns.",
    "NUMSUB [<channel> ...]",
    "    Return the number of subscribers for the specified channels, excluding",
    "    pattern subscriptions(default: no channels).",
    "SHARDCHANNELS [<pattern>]",
    "    Return the currently active shard level channels matching a <pattern> (default: '*').",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    Return the number of subscribers for the specified shard level channel(s)",
    "HELP",
    "    Prints this help.",
]


def _pubsub(ctx: Context, args: Sequence[bytes]) -> Reply:
    pubsub = ctx.state.pubsub
    raw = args[0]
    sub = raw.decode("utf-8", "replace")
    rest = args[1:]
    upper = sub.upper()
    if upper in ("CHANNELS", "SHARDCHANNELS"):
        if len(rest) > 1:
            raise PionError(
                f"unknown subcommand or wrong number of arguments for '{sub[:128]}'. "
                "Try PUBSUB HELP."
            )
        kind = Kind.CHANNEL if upper == "CHANNELS" else Kind.SHARD
        found: list[Reply] = list(pubsub.matching(kind, rest[0] if rest else None))
        return found
    if upper in ("NUMSUB", "SHARDNUMSUB"):
        kind = Kind.CHANNEL if upper == "NUMSUB" else Kind.SHARD
        flat: list[Reply] = []
        for name in rest:
            flat += [name, pubsub.numsub(kind, name)]
        return flat
    if upper in ("NUMPAT", "HELP"):
        if rest:
            raise PionError(f"wrong number of arguments for 'pubsub|{upper.lower()}' command")
        if upper == "HELP":
            return [Simple(line) for line in _HELP]
        return len(pubsub.table[Kind.PATTERN])
    raise PionError(f"unknown subcommand '{sub[:128]}'. Try PUBSUB HELP.")


COMMANDS = (
    _subscriber(Kind.CHANNEL),
    _subscriber(Kind.PATTERN),
    _subscriber(Kind.SHARD),
    _unsubscriber(Kind.CHANNEL),
    _unsubscriber(Kind.PATTERN),
    _unsubscriber(Kind.SHARD),
    Command("PUBLISH", _publish, 3, frozenset({"loading", "fast"}), "Post a message to a channel"),
    Command("SPUBLISH", _spublish, 3, frozenset({"loading", "fast"}), "Post to a shard channel"),
    Command("PUBSUB", _pubsub, -2, frozenset({"loading"}), "Inspect the pub/sub state"),
)
