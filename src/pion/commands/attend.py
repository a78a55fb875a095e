"""The attention tier over RESP: ``ATTEND.PREFIX.*`` and ``KV.PREFIX.WARM``
(docs/protocol.md, "Attention tier").

Handlers parse their arguments with :class:`~pion.commands.args.Args` in the order of
the wire reference and hand them to :mod:`pion.attend.queries`, which validates
everything before it reads or changes a slot. Replies are fp32 blobs, sent as views
of the result arrays (never joined into one bytes object).

``ATTEND.PREFIX.DROP`` is ours (Pion has no RESP form of it): it lets a client free
the slots of a session it is done with instead of waiting for LRU demotion.

None of these commands is flagged ``write``: attention slots live in memory only (the
durable copy of a prefix is the V-store's), so a failing log does not refuse them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pion.attend import queries
from pion.attend.queries import (
    MAX_LAYER,
    FusedQuery,
    PrefixQuery,
    SparseQuery,
    StoreRequest,
)
from pion.attend.warm import warm
from pion.commands.args import Args, check_length
from pion.commands.state import Command, Context, ServerState
from pion.commands.workers import redirect_namespace
from pion.errors import PionError
from pion.prefix.registry import k_sid, v_sid
from pion.resp.reply import Reply, Simple
from pion.vstore import MAX_SID_LEN
from pion.wire import bytes_of

__all__ = ["COMMANDS"]

# S_suf and the sparse B/K_top are counts of tokens/blocks; their blobs bound them in
# practice, this bounds the arithmetic before any blob is looked at.
MAX_COUNT = 2**31 - 1


def _layer(cur: Args) -> int:
    return cur.integer(
        "layer_id", 0, MAX_LAYER, f"{cur.command}: layer_id out of range (0..{MAX_LAYER})"
    )


def _count(cur: Args, what: str, lo: int = 0) -> int:
    return cur.integer(
        what, lo, MAX_COUNT, f"{cur.command}: {what} out of range ({lo}..{MAX_COUNT})"
    )


def _optional_int(cur: Args, what: str, default: int) -> int:
    return default if cur.done() else cur.integer(what)


def _default_window(state: ServerState) -> int:
    return state.config.fa_window


# -- STORE / LOOKUP / DROP ---------------------------------------------------------


def _store(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "ATTEND.PREFIX.STORE")
    sid, layer = cur.session_id(), _layer(cur)
    h, n, d = (_count(cur, what) for what in ("H", "N", "D"))
    k, v = cur.arg("K_blob"), cur.arg("V_blob")
    cur.expect_done()
    queries.store(ctx.state.attention, cur.command, StoreRequest(sid, layer, h, n, d, k, v))
    return Simple("OK")


def _lookup(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "ATTEND.PREFIX.LOOKUP")
    key = (cur.session_id(), _layer(cur))
    state = ctx.state.attention.state(key, touch=True)
    return Simple({"warm": "HIT", "cold": "COLD", "missing": "MISS"}[state])


def _drop(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "ATTEND.PREFIX.DROP")
    sid = cur.session_id()
    layer = None if cur.done() else _layer(cur)
    cur.expect_done()
    return ctx.state.attention.drop(sid, layer)


# -- queries -----------------------------------------------------------------------


def _query(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "ATTEND.PREFIX.QUERY")
    sid, layer = cur.session_id(), _layer(cur)
    h, d = _count(cur, "H"), _count(cur, "D")
    cur.integer("top_k", 1, None, f"{cur.command}: invalid top_k (must be > 0)")
    q = cur.arg("Q_blob")
    fa_window = _optional_int(cur, "fa_window", -1)
    cur.expect_done()
    state = ctx.state
    req = PrefixQuery(sid, layer, h, d, q, fa_window)
    result = queries.query(state.attention, cur.command, req, _default_window(state))
    if result.out.shape[1] == 1:
        return bytes_of(result.out)
    # M > 1: the output, then the LSE trailer [H, M] (logsumexp of the scaled scores).
    return bytes_of(np.concatenate((result.out.ravel(), result.lse.ravel())))


def _query_fused(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "ATTEND.PREFIX.QUERY_FUSED")
    sid, layer = cur.session_id(), _layer(cur)
    h_q, d, s_suf, h_kv = (_count(cur, what) for what in ("H_q", "D", "S_suf", "H_kv"))
    q, k_suf, v_suf, head_map = (cur.arg(what) for what in ("Q", "K_suf", "V_suf", "head_map"))
    fa_window = _optional_int(cur, "fa_window", -1)
    cur.expect_done()
    req = FusedQuery(sid, layer, h_q, d, s_suf, h_kv, q, k_suf, v_suf, head_map, fa_window)
    state = ctx.state
    return bytes_of(queries.query_fused(state.attention, cur.command, req, _default_window(state)))


def _sparse(ctx: Context, args: Sequence[bytes], fused: bool) -> Reply:
    name = "ATTEND.PREFIX.QUERY_SPARSE_AUTO" + ("_FUSED" if fused else "")
    cur = Args(args, name)
    sid, layer = cur.session_id(), _layer(cur)
    h_q, d, block, top, h_kv = (_count(cur, w) for w in ("H_q", "D", "B", "K_top", "H_kv"))
    if fused:
        s_suf = _count(cur, "S_suf")
        q, k_suf, v_suf, head_map = (cur.arg(w) for w in ("Q", "K_suf", "V_suf", "head_map"))
    else:
        s_suf, k_suf, v_suf = 0, b"", b""
        q, head_map = cur.arg("Q"), cur.arg("head_map")
    fa_window = _optional_int(cur, "fa_window", -1)
    selector = _optional_int(cur, "selector_id", 0)
    cur.expect_done()
    req = SparseQuery(
        sid, layer, h_q, d, block, top, h_kv, q, head_map, s_suf, k_suf, v_suf, fa_window, selector
    )
    state = ctx.state
    return bytes_of(queries.query_sparse(state.attention, cur.command, req, _default_window(state)))


def _sparse_auto(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _sparse(ctx, args, fused=False)


def _sparse_auto_fused(ctx: Context, args: Sequence[bytes]) -> Reply:
    return _sparse(ctx, args, fused=True)


# -- KV.PREFIX.WARM ----------------------------------------------------------------


def _warm(ctx: Context, args: Sequence[bytes]) -> Reply:
    cmd = "KV.PREFIX.WARM"
    cur = Args(args, cmd)
    ns = cur.namespace()
    h, d = cur.heads()
    attend_sid = ns
    if not cur.done():
        attend_sid = cur.arg("attend_sid") or ns
        check_length(attend_sid, MAX_SID_LEN, f"{cmd}: attend_sid")
    cur.expect_done()
    redirect_namespace(ctx, ns, cmd)
    state = ctx.state
    if not state.registry.is_registered(ns):
        raise PionError(f"{cmd} namespace not registered (call KV.PREFIX.REGISTER first)")
    halves = (k_sid(ns), v_sid(ns))
    layers, skipped = warm(state.vstore, state.attention, halves, h=h, d=d, attend_sid=attend_sid)
    return Simple(f"{layers} skipped_dim={skipped}" if skipped else str(layers))


COMMANDS: list[Command] = [
    Command("ATTEND.PREFIX.STORE", _store, 8, frozenset(), "Hold one layer's K/V [H, N, D]"),
    Command(
        "ATTEND.PREFIX.LOOKUP",
        _lookup,
        3,
        frozenset({"readonly", "fast"}),
        "HIT (warm), COLD (demoted) or MISS",
    ),
    Command(
        "ATTEND.PREFIX.QUERY",
        _query,
        -7,
        frozenset({"readonly"}),
        "Attention of Q over the cached prefix (LSE trailer for M > 1)",
    ),
    Command(
        "ATTEND.PREFIX.QUERY_FUSED",
        _query_fused,
        -11,
        frozenset({"readonly"}),
        "GQA attention over the prefix plus a causal suffix",
    ),
    Command(
        "ATTEND.PREFIX.QUERY_SPARSE_AUTO",
        _sparse_auto,
        -10,
        frozenset({"readonly"}),
        "M=1 attention over the top blocks of the prefix",
    ),
    Command(
        "ATTEND.PREFIX.QUERY_SPARSE_AUTO_FUSED",
        _sparse_auto_fused,
        -13,
        frozenset({"readonly"}),
        "Sparse prefix attention plus a dense suffix",
    ),
    Command("ATTEND.PREFIX.DROP", _drop, -2, frozenset(), "Free a session's attention slots"),
    Command(
        "KV.PREFIX.WARM",
        _warm,
        -4,
        frozenset(),
        "Rehydrate the attention tier from the V-store",
    ),
]
