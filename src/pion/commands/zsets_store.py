"""ZRANGESTORE: ZRANGE's selection (by rank, BYSCORE or BYLEX, REV, LIMIT) stored as a
sorted set, with Redis 7.0's argument order and error texts (``zsets.zrange_pick``
parses as ZRANGE does; WITHSCORES is a syntax error here, as in Redis).

The destination becomes exactly the selected members with their scores, whatever it
held (one ZSTORE record, so the replacement is atomic across a crash); an empty
selection deletes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.state import Command, Context
from pion.commands.zsets import zrange_pick
from pion.notify import GENERIC, ZSET, notify
from pion.resp.reply import Reply

__all__ = ["COMMANDS"]


def _zrangestore(ctx: Context, args: Sequence[bytes]) -> Reply:
    dst = args[0]
    picked, _ = zrange_pick(ctx, args[1:], store=True)
    ks = ctx.state.keyspace
    if not picked:
        if ks.delete((dst,)):
            notify(ctx.state, GENERIC, "del", dst)
        return 0
    ks.zset_replace(dst, picked)
    notify(ctx.state, ZSET, "zrangestore", dst)
    return len(picked)


COMMANDS: list[Command] = [
    Command("ZRANGESTORE", _zrangestore, -5, frozenset({"write"}), "ZRANGE into a key"),
]
