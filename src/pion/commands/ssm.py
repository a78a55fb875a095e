"""``SSM.PREFIX.*``: opaque per-layer state blobs of recurrent and hybrid models
(docs/protocol.md, "SSM state"), stored by :class:`pion.ssm.SsmStore`.

- ``SSM.PREFIX.STORE <sid> <layer> <blob>`` -> ``+OK`` (an empty blob is kept);
- ``SSM.PREFIX.FETCH <sid> <layer>`` -> the blob, ``$-1`` when absent;
- ``SSM.PREFIX.DROP <sid> [<layer>]`` -> ``+OK`` (every layer when none is named).

STORE and DROP are ``write`` commands: they reach the write-ahead log before the reply.
"""

from __future__ import annotations

from collections.abc import Sequence

from pion.commands.args import Args
from pion.commands.state import Command, Context
from pion.resp.reply import Reply, Simple
from pion.ssm import MAX_SSM_LAYER

__all__ = ["COMMANDS"]


def _key(cur: Args) -> tuple[bytes, int]:
    return cur.session_id(), _layer(cur)


def _layer(cur: Args) -> int:
    return cur.integer(
        "layer_id", 0, MAX_SSM_LAYER, f"{cur.command}: layer_id out of range (0..{MAX_SSM_LAYER})"
    )


def _store(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "SSM.PREFIX.STORE")
    sid, layer = _key(cur)
    blob = cur.arg("state_blob")
    ctx.state.ssm.store(sid, layer, bytes(blob))
    return Simple("OK")


def _fetch(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "SSM.PREFIX.FETCH")
    sid, layer = _key(cur)
    return ctx.state.ssm.get(sid, layer)


def _drop(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "SSM.PREFIX.DROP")
    sid = cur.session_id()
    layer = None if cur.done() else _layer(cur)
    cur.expect_done()
    ctx.state.ssm.drop(sid, layer)
    return Simple("OK")


COMMANDS: list[Command] = [
    Command(
        "SSM.PREFIX.STORE", _store, 4, frozenset({"write"}), "Keep one layer's recurrent state"
    ),
    Command(
        "SSM.PREFIX.FETCH",
        _fetch,
        3,
        frozenset({"readonly", "fast"}),
        "One layer's recurrent state, or nil",
    ),
    Command(
        "SSM.PREFIX.DROP", _drop, -2, frozenset({"write"}), "Forget a session's recurrent state"
    ),
]
