"""``V.EXPORT``: a prefix's K/V written once as a safetensors file for a client on this
machine, which maps it instead of reading it through the socket (Pion 0.9.8)::

    V.EXPORT <sid_k> <sid_v> <start> <end> <n_layers> <n_kv_heads> <head_dim>
        -> bulk: the file's absolute path

The file holds ``k.<i>`` (from ``sid_k``) and ``v.<i>`` (from ``sid_v``) for layers
``0 .. n_layers-1``, each F16 ``[1, n_kv_heads, end-start, head_dim]`` (the layout is
``pion.export.format``'s docstring). ``end`` is exclusive, as in ``V.FETCH ... RANGE``;
Pion's client sends ``0`` and the prefix length. The same request is answered with the
same file while both sessions' rows are unchanged; a write, restore or drop of either
removes it (``pion.export.cache``).

Refused, each with a message saying to use ``V.FETCH`` instead: a client whose
connection does not come from a loopback address (``pion.export.peer``), a server
started with ``--no-export``, a layer missing, empty in the range or not
``n_kv_heads * head_dim`` wide, a file beyond the byte limits or the disk's free space.
Pion's client answers any error by turning its export lane off and fetching over TCP.

Under ``-w N`` a session another worker owns answers the V-store redirect (``session
lives on worker N ...; reconnect for V.EXPORT``), and with ``--tier`` a session only the
tier holds is filled from it first, both as ``V.FETCH`` does. Every argument is parsed
and bounded before the store is read. Each V.EXPORT counts as
a fetch of its layers (``total_fetches``, the LRU clock of both sessions) and credits
the file's data bytes to the value receipt's ``kvprefix_bytes_served``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pion.commands.args import Args
from pion.commands.state import Command, Context
from pion.commands.workers import redirect_session
from pion.errors import PionError
from pion.export.peer import is_local_peer, peer_host
from pion.export.writer import ExportRequest
from pion.resp.reply import Reply

__all__ = ["COMMANDS"]


def v_export(ctx: Context, argv: Sequence[bytes]) -> Reply:
    """``V.EXPORT sid_k sid_v start end n_layers n_kv_heads head_dim`` -> path"""
    limits = ctx.state.config.vstore
    a = Args(argv, "V.EXPORT")
    sid_k = a.arg("sid_k")
    sid_v = a.arg("sid_v")
    start = a.integer("start")
    end = a.integer("end")
    n_layers = a.integer("n_layers")
    heads = a.integer("n_kv_heads")
    head_dim = a.integer("head_dim")
    a.expect_done()
    exports = ctx.state.exports
    if exports is None:
        raise PionError("V.EXPORT: disabled on this server (--no-export); use V.FETCH")
    if not is_local_peer(ctx.client.addr):
        raise PionError(
            f"V.EXPORT: refused for a non-local client (peer {peer_host(ctx.client.addr)}): "
            "export files are for clients on the server's machine over loopback; use V.FETCH"
        )
    if start < 0 or end <= start:
        raise PionError("V.EXPORT: invalid range: end must exceed start (>=0)")
    if end > limits.max_rows:
        raise PionError(f"V.EXPORT: rows out of range (end must be <= {limits.max_rows})")
    if not 1 <= n_layers <= limits.max_layers:
        raise PionError(f"V.EXPORT: n_layers out of range (1..{limits.max_layers})")
    if not (1 <= heads <= limits.max_dim and 1 <= head_dim <= limits.max_dim):
        raise PionError(f"V.EXPORT: n_kv_heads and head_dim must be 1..{limits.max_dim}")
    if heads * head_dim > limits.max_dim:
        raise PionError(f"V.EXPORT: n_kv_heads*head_dim exceeds the largest dim {limits.max_dim}")
    for sid in (sid_k, sid_v):
        # As V.FETCH: a session another worker owns is a redirect (-w N), and one only
        # the cluster tier holds is filled from it first (--tier).
        redirect_session(ctx, sid, "V.EXPORT")
        if ctx.state.tier is not None:
            ctx.state.tier.ensure_local((sid,), required=True, may_wait=ctx.may_wait)
    req = ExportRequest(sid_k, sid_v, start, end, n_layers, heads, head_dim)
    done = exports.export(ctx.state.vstore, req)
    ctx.state.receipt.credit_bytes(done.nbytes)
    return os.fsencode(done.path)


COMMANDS: list[Command] = [
    Command(
        "V.EXPORT",
        v_export,
        8,
        frozenset({"readonly"}),
        "Write a prefix's K/V as a safetensors file for a loopback client; replies its path",
    ),
]
