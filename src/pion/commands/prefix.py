"""KV.PREFIX.* registry commands and the value receipt PION.STATS (docs/protocol.md).

Every handler parses and range-checks all of its arguments before it touches the
registry, so a bad option records nothing. Error texts are part of the wire contract:
clients and routers match on them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from time import perf_counter_ns

import numpy as np

from pion.codecs import FORMAT_NAMES, SCHEMA_ONLY_FORMATS
from pion.commands.args import Args, check_length
from pion.commands.execution import failed
from pion.commands.state import Command, Context
from pion.commands.vstore import format_name
from pion.commands.workers import (
    directory_fields,
    owner_of,
    redirect_namespace,
    redirect_namespaces,
)
from pion.errors import PionError
from pion.resp.encoder import Chunks, encode_error, encode_simple
from pion.resp.reply import Reply, Simple
from pion.wire import MAX_NS_LEN, namespace_sids

__all__ = ["COMMANDS"]

MAX_BLOCK_SIZE = 8192
MAX_HASH_COUNT = 1_048_576
MAX_PREFILL_MS = 86_400_000  # one day
MAX_TOKENS = 2**31 - 1
_UNKNOWN = Simple("UNKNOWN")
_HIT = Simple("HIT")
_MISS = Simple("MISS")
_BLOCKS_HEADER = struct.Struct("<II")


def _hash_blob(cur: Args, cmd: str, count_error: str) -> bytes:
    """``<count> <blob>`` of little-endian u64: the blob, both checked before any
    allocation."""
    count = cur.integer("hash_count", 0, MAX_HASH_COUNT, f"{cmd}: {count_error}")
    blob = cur.arg("hash_blob")
    if len(blob) != count * 8:
        raise PionError(f"{cmd}: hash_blob length mismatch ({len(blob)} != {count * 8})")
    return blob


def _prefill_ms(cur: Args, cmd: str) -> int:
    return cur.integer(
        "PREFILL_MS", 0, MAX_PREFILL_MS, f"{cmd}: PREFILL_MS out of range (0..{MAX_PREFILL_MS})"
    )


def _register(ctx: Context, args: Sequence[bytes]) -> Reply:
    cmd = "KV.PREFIX.REGISTER"
    cur = Args(args, cmd)
    ns = cur.namespace()
    max_dim = ctx.state.config.vstore.max_dim
    kv_dim = cur.integer("kv_dim", 1, max_dim, f"{cmd}: kv_dim out of range (1..{max_dim})")
    raw_vquant = cur.arg("vquant")
    vquant = format_name(raw_vquant)
    if vquant is None:
        shown = raw_vquant[:64].decode("utf-8", "replace")
        # A SCHEMA-only format cannot be a whole namespace's: say where it does belong.
        schema_only = format_name(raw_vquant, SCHEMA_ONLY_FORMATS) is not None
        hint = "; it is per layer: V.CREATE ... SCHEMA" if schema_only else ""
        raise PionError(f"{cmd}: unknown vquant '{shown}' (want {'|'.join(FORMAT_NAMES)}){hint}")
    blocks: tuple[int, np.ndarray] | None = None
    prefill_ms = 0
    while not cur.done():
        opt = cur.keyword()
        if opt == "BLOCKS":
            if len(cur) < 3:
                raise PionError(f"{cmd}: BLOCKS requires: block_size hash_count hash_blob")
            bs = cur.integer(
                "block_size",
                1,
                MAX_BLOCK_SIZE,
                f"{cmd}: BLOCKS block_size out of range (1..{MAX_BLOCK_SIZE})",
            )
            hashes = _hash_blob(cur, cmd, f"BLOCKS hash_count out of range (0..{MAX_HASH_COUNT})")
            blocks = (bs, np.frombuffer(hashes, dtype="<u8"))
        elif opt == "PREFILL_MS":
            if cur.done():
                raise PionError(f"{cmd}: PREFILL_MS requires a value")
            prefill_ms = _prefill_ms(cur, cmd)
        else:
            raise PionError(f"{cmd}: unknown option '{opt or '?'}'")
    if ctx.state.tier is not None:  # keep the layout another node registered
        ctx.state.tier.ensure_local(namespace_sids(ns), required=False, may_wait=ctx.may_wait)
    ctx.state.registry.register(ns, kv_dim, vquant, blocks, prefill_ms)
    return Simple("OK")


def _lookup(ctx: Context, args: Sequence[bytes]) -> Reply:
    cmd = "KV.PREFIX.LOOKUP"
    tokens: int | None = None
    prefill_ms: int | None = None
    if len(args) == 1:
        # The form routers probe with, many times a second: no cursor, and nothing is
        # allocated beyond the reply, which is a constant.
        ns = args[0]
        if not 1 <= len(ns) <= MAX_NS_LEN:
            check_length(ns, MAX_NS_LEN, f"{cmd}: ns_key")  # raises, in its words
    else:
        cur = Args(args, cmd)
        ns = cur.namespace()
        while not cur.done():
            opt = cur.keyword()
            if cur.done():
                raise PionError(f"{cmd}: {opt or 'option'} requires a value")
            if opt == "TOKENS":
                tokens = cur.integer(
                    "TOKENS", 0, MAX_TOKENS, f"{cmd}: TOKENS out of range (0..{MAX_TOKENS})"
                )
            elif opt == "PREFILL_MS":
                prefill_ms = _prefill_ms(cur, cmd)
            else:
                raise PionError(f"{cmd}: unknown option '{opt or '?'}'")
    if ctx.state.tier is not None:
        ctx.state.tier.before_lookup(ns, may_wait=ctx.may_wait)
    return _HIT if ctx.state.registry.lookup(ns, tokens, prefill_ms) else _MISS


LOOKUPS = (b"KV.PREFIX.LOOKUP", b"kv.prefix.lookup")
_LOOKUP_REPLIES = {True: encode_simple(_HIT), False: encode_simple(_MISS)}


def serve_lookups(
    ctx: Context, ready: list[list[bytes]], out: Chunks, limit: int
) -> tuple[int, int]:
    """A run of router probes from the end of ``ready`` (next last), at most ``limit``,
    while each is a LOOKUP of one valid name (as it arrives, upper or lower case) and
    the server has no tier to ask first: what :func:`_lookup` does for them, timed and
    counted as the boundary (``execution.call``) times and counts a handler, and a
    failure turned into its reply by the boundary's own conversion
    (``execution.failed``). Returns ``(commands served, reply bytes)``; the caller
    made the checks every command passes (``pion.server.batch``)."""
    state = ctx.state
    if state.tier is not None:
        return 0, 0  # it may have to wait for a fill: the lane's
    client = ctx.client
    stats = state.stats
    lookup = state.registry.lookup
    name = "KV.PREFIX.LOOKUP"
    slow_us = stats.slowlog_threshold_us
    done = nbytes = usec = ok = 0
    while ready and done < limit:
        argv = ready[-1]
        if len(argv) != 2 or argv[0] not in LOOKUPS or not 0 < len(argv[1]) <= MAX_NS_LEN:
            break
        ready.pop()
        started = perf_counter_ns()
        try:
            reply = _LOOKUP_REPLIES[lookup(argv[1], None, None)]
        except Exception as exc:  # a bug: the boundary's reply, counted as it counts it
            error = failed(ctx, name, exc)
            stats.record(name, argv, error, started, client)
            reply = encode_error(str(error))
        else:
            took = (perf_counter_ns() - started) // 1000
            usec += took
            ok += 1
            if took >= slow_us >= 0:
                stats.log_slow(argv, took, client)
        out.append(reply)
        nbytes += len(reply)
        done += 1
    if done:
        stats.record_many(name, ok, usec)
        state.counters.total_commands_processed += done
        client.last_command = name
    return done, nbytes


def _drop(ctx: Context, args: Sequence[bytes]) -> Reply:
    cmd = "KV.PREFIX.DROP"
    cur = Args(args, cmd)
    namespaces = [cur.namespace() for _ in range(len(args))]
    redirect_namespaces(ctx, namespaces, cmd)
    tier = ctx.state.tier
    return sum(
        (tier is not None and tier.before_drop(ns, may_wait=ctx.may_wait))
        | ctx.state.registry.drop(ns)
        for ns in dict.fromkeys(namespaces)
    )


def _owner(ctx: Context, args: Sequence[bytes]) -> Reply:
    ns = Args(args, "KV.PREFIX.OWNER").namespace()
    return Simple(str(owner_of(ctx, ns)))


def _blocks(ctx: Context, args: Sequence[bytes]) -> Reply:
    ns = Args(args, "KV.PREFIX.BLOCKS").namespace()
    redirect_namespace(ctx, ns, "KV.PREFIX.BLOCKS")
    if ctx.state.tier is not None:
        ctx.state.tier.ensure_local(namespace_sids(ns)[:1], required=True, may_wait=ctx.may_wait)
    table = ctx.state.registry.block_table(ns)
    if table is None:
        return _UNKNOWN
    body = bytearray(_BLOCKS_HEADER.pack(table.block_size, table.count))
    body += table.hashes.tobytes()
    return body


def _membership(ctx: Context, args: Sequence[bytes]) -> Reply:
    cmd = "KV.PREFIX.MEMBERSHIP"
    cur = Args(args, cmd)
    ns = cur.namespace()
    probes = _hash_blob(cur, cmd, f"hash_count out of range (0..{MAX_HASH_COUNT})")
    redirect_namespace(ctx, ns, cmd)
    if ctx.state.tier is not None:
        ctx.state.tier.ensure_local(namespace_sids(ns)[:1], required=True, may_wait=ctx.may_wait)
    table = ctx.state.registry.block_table(ns)
    if table is None:
        return _UNKNOWN
    if not probes:
        return b""
    return table.member_bits(probes)


def _info(ctx: Context, args: Sequence[bytes]) -> Reply:
    state = ctx.state
    vs = state.vstore
    wal = state.persistence.info() if state.persistence is not None else {}
    fields: list[tuple[str, int | str]] = [
        ("registered_prefixes", len(state.registry.registered())),
        ("total_prefix_tokens", state.registry.total_prefix_tokens()),
        ("vstore_sessions", vs.session_count),
        ("vstore_total_fetches", vs.total_fetches),
        ("vstore_evictions", vs.evictions),
        ("vstore_max_sessions", vs.max_sessions),
        ("vstore_bytes", vs.vstore_bytes),
        ("wal_enabled", wal.get("wal_enabled", 0)),
        ("wal_bytes", wal.get("wal_bytes", 0)),
        ("wal_appended", wal.get("wal_appended", 0)),
        ("wal_replayed", wal.get("wal_replayed", 0)),
        *directory_fields(state),
        # The attention tier's slot tables (docs/attention.md).
        ("sdpa_warm", state.attention.warm_count),
        ("sdpa_cold", state.attention.cold_count),
        ("sdpa_demotions", state.attention.demotions),
        ("sdpa_rehydrates", state.attention.rehydrates),
    ]
    # A plain bulk string, as Pion sends it (not RESP3 verbatim).
    return "".join(f"{k}:{v}\r\n" for k, v in fields)


def _pion_stats(ctx: Context, args: Sequence[bytes]) -> Reply:
    cur = Args(args, "PION.STATS")
    if not cur.done():
        if cur.peek_keyword() != "RESET" or len(cur) != 1:
            raise PionError("PION.STATS: unknown subcommand (want RESET)")
        ctx.state.receipt.reset()
        if ctx.state.tier is not None:
            ctx.state.tier.reset_stats()
        return Simple("OK")
    pairs: dict[str | bytes, Reply] = {k: v for k, v in ctx.state.receipt.pairs().items()}
    if ctx.state.tier is not None:  # only with --tier: the sixteen stay Pion's
        pairs.update(ctx.state.tier.stats_pairs())
    return pairs


COMMANDS: list[Command] = [
    Command(
        "KV.PREFIX.REGISTER",
        _register,
        -4,
        frozenset({"write"}),
        "Register a prefix namespace (K/V session pair, block table, PREFILL_MS)",
    ),
    Command(
        "KV.PREFIX.LOOKUP",
        _lookup,
        -2,
        frozenset({"readonly", "fast"}),
        "HIT iff both halves of the namespace are held; credits the receipt",
    ),
    Command("KV.PREFIX.DROP", _drop, -2, frozenset({"write"}), "Drop namespaces"),
    Command(
        "KV.PREFIX.OWNER",
        _owner,
        2,
        frozenset({"readonly", "fast"}),
        "The worker holding a namespace, or -1",
    ),
    Command(
        "KV.PREFIX.BLOCKS", _blocks, 2, frozenset({"readonly"}), "The registered block-hash table"
    ),
    Command(
        "KV.PREFIX.MEMBERSHIP",
        _membership,
        4,
        frozenset({"readonly", "fast"}),
        "Bitmap of which probe hashes are in the block table",
    ),
    Command(
        "KV.PREFIX.INFO",
        _info,
        1,
        frozenset({"readonly", "loading"}),
        "Registry, V-store and WAL counters",
    ),
    Command(
        "PION.STATS",
        _pion_stats,
        -1,
        frozenset({"loading"}),
        "The value receipt; PION.STATS RESET zeroes it",
    ),
]
