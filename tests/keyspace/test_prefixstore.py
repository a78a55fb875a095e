"""The real PrefixStore of ``pion-vllm-mlx`` (its numpy-only paths) against pion-server.

``PionPrefixStore.store()`` needs mlx, so a lineage is written here with the raw
commands ``store()`` sends (same keys, same order: layout, INCR nextseg, REGISTER,
HSET seg, V.STOREBATCH ... FMT F16, HSET len/toks, HSET blk, ZADD lru). Then the real
client's ``lookup`` must find it and ``fetch_rows`` restore it bit-identically; its
budget path (SCAN backfill, ZRANGE WITHSCORES, leaf eviction with DEL/ZREM/HDEL,
idle-time KV.PREFIX.SAVE) and its decode journal (SET + EXPIRE, GET, DEL) must work;
and after kill -9 the keys and the rows come back together, from the one log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis
from pion_vllm_mlx.prefix_store import PionPrefixStore

from pion.server.run import ServerThread

MODEL = ("tiny-llama", 3)
LAYERS, HEADS, HEAD_DIM = 3, 2, 8
KV_DIM = HEADS * HEAD_DIM


def rows_for(seg_id: int, n: int, layer: int, side: int) -> np.ndarray:
    """Deterministic fp16 K/V rows [n, kv_dim] for one segment's layer."""
    rng = np.random.default_rng(1000 * seg_id + 10 * layer + side)
    return rng.standard_normal((n, KV_DIM)).astype(np.float16)


def write_segment(
    r: redis.Redis,
    ps: PionPrefixStore,
    tokens: list[int],
    parent: int,
    base: int,
) -> int:
    """A segment holding rows ``base .. len(tokens)`` of ``tokens``, as store() writes it."""
    mid = ps.model_id(MODEL)
    if r.get(f"pps:{mid}:layout") is None:
        r.set(f"pps:{mid}:layout", f"{LAYERS},{HEADS},{HEAD_DIM},float16,native")
    sid = int(r.incr(f"pps:{mid}:nextseg"))
    ns = f"pps{mid}s{sid}"
    assert r.execute_command("KV.PREFIX.REGISTER", ns, KV_DIM, "fp16") == b"OK"
    r.hset(f"pps:{mid}:seg:{sid}", mapping={"parent": parent, "base": base, "len": 0, "toks": b""})
    n = len(tokens) - base
    pipe = r.pipeline(transaction=False)
    for layer in range(LAYERS):
        for side, half in ((0, "_pk"), (1, "_pv")):
            blob = rows_for(sid, n, layer, side).tobytes()
            pipe.execute_command("V.STOREBATCH", ns + half, layer, 0, n, blob, "FMT", "F16")
    assert all(x == b"OK" for x in pipe.execute())
    own = np.asarray(tokens[base:], dtype=np.uint32)
    pipe.hset(f"pps:{mid}:seg:{sid}", mapping={"len": n, "toks": own.tobytes()})
    hashes = ps.block_hashes(tokens)
    fields: dict[str, str] = {}
    for k in range(base // ps.BLOCK, len(tokens) // ps.BLOCK):
        end = (k + 1) * ps.BLOCK
        if end > base:
            fields[hashes[k]] = f"{sid}:{end}"
    if fields:
        pipe.hset(f"pps:{mid}:blk", mapping=fields)
    pipe.zadd(ps.LRU_KEY, {f"{mid}:{sid}": time.time()})
    pipe.execute()
    return sid


def expected_rows(
    chain: list[tuple[int, int, int]], end: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(K, V) per layer, [heads, end, head_dim], from (seg id, base, seg end) pieces."""
    out = []
    for layer in range(LAYERS):
        parts: list[list[np.ndarray]] = [[], []]
        for i, (sid, base, seg_end) in enumerate(chain):
            hi = min(chain[i + 1][1] if i + 1 < len(chain) else seg_end, end)
            for side in (0, 1):
                parts[side].append(rows_for(sid, seg_end - base, layer, side)[: hi - base])
        k, v = (np.concatenate(p).reshape(end, HEADS, HEAD_DIM).transpose(1, 0, 2) for p in parts)
        out.append((k, v))
    return out


def assert_bit_identical(got: Any, want: list[tuple[np.ndarray, np.ndarray]]) -> None:
    assert got is not None and len(got) == len(want)
    for (gk, gv), (wk, wv) in zip(got, want, strict=True):
        assert gk.dtype == np.float16 and gk.shape == wk.shape
        assert gk.tobytes() == wk.tobytes() and gv.tobytes() == wv.tobytes()


@pytest.fixture
def stack(server: ServerThread, client: redis.Redis) -> tuple[redis.Redis, PionPrefixStore]:
    return client, PionPrefixStore("127.0.0.1", server.port, vquant="fp16")


def lineage(r: redis.Redis, ps: PionPrefixStore) -> tuple[list[int], list[int], int, int]:
    rng = np.random.default_rng(3)
    root = [int(t) for t in rng.integers(0, 50_000, 200)]
    branch = root[:150] + [int(t) for t in rng.integers(0, 50_000, 90)]  # diverges at 150
    s1 = write_segment(r, ps, root, parent=-1, base=0)
    s2 = write_segment(r, ps, branch, parent=s1, base=150)
    return root, branch, s1, s2


def test_lookup_finds_and_fetch_rows_restores_bit_identically(
    stack: tuple[redis.Redis, PionPrefixStore],
) -> None:
    r, ps = stack
    root, branch, s1, s2 = lineage(r, ps)
    m = ps.lookup(MODEL, [*root, 7, 8, 9])
    assert m.length == 200 and [s.id for s in m.chain] == [s1]
    assert_bit_identical(ps.fetch_rows(MODEL, m, 0, 200), expected_rows([(s1, 0, 200)], 200))
    m2 = ps.lookup(MODEL, branch)
    assert m2.length == 240 and [s.id for s in m2.chain] == [s1, s2]
    want = expected_rows([(s1, 0, 200), (s2, 150, 240)], 240)
    assert_bit_identical(ps.fetch_rows(MODEL, m2, 0, 240), want)
    assert ps.lookup(MODEL, [1, 2, 3] * 100).length == 0  # nothing shares its first block
    ps.commit()


def test_budget_evicts_the_least_recently_used_leaf(
    stack: tuple[redis.Redis, PionPrefixStore],
) -> None:
    r, ps = stack
    _root, branch, s1, s2 = lineage(r, ps)
    other = [int(t) for t in np.random.default_rng(9).integers(0, 50_000, 100)]
    s3 = write_segment(r, ps, other, parent=-1, base=0)
    mid = ps.model_id(MODEL)
    r.zadd(ps.LRU_KEY, {f"{mid}:{s2}": 1.0, f"{mid}:{s1}": 2.0})  # the leaf older than its root
    r.zrem(ps.LRU_KEY, f"{mid}:{s3}")  # never touched: the SCAN backfill gives it 0
    row = 2 * LAYERS * KV_DIM * 2  # V-store bytes per token: K and V, fp16
    ps.budget_bytes = ps.info()["vstore_bytes"] - 100 * row - 1  # s3 and one more must go
    ps._enforce_budget(set())
    assert ps.stats.evictions == 2
    assert r.exists(f"pps:{mid}:seg:{s3}", f"pps:{mid}:seg:{s2}") == 0
    assert r.exists(f"pps:{mid}:seg:{s1}") == 1
    for gone in (s2, s3):
        assert r.execute_command("KV.PREFIX.LOOKUP", f"pps{mid}s{gone}") == b"MISS"
    assert r.zrange(ps.LRU_KEY, 0, -1, withscores=True) == [(f"{mid}:{s1}".encode(), 2.0)]
    # Block entries that pointed into the dropped segments are gone; the root's remain.
    index = r.hgetall(f"pps:{mid}:blk")
    assert index and all(v.startswith(f"{s1}:".encode()) for v in index.values())
    assert ps.lookup(MODEL, other).length == 0
    m = ps.lookup(MODEL, branch)
    assert [s.id for s in m.chain] == [s1] and m.length == 150
    assert_bit_identical(ps.fetch_rows(MODEL, m, 0, 150), expected_rows([(s1, 0, 200)], 150))


def test_idle_compaction_snapshots_both_stores(
    stack: tuple[redis.Redis, PionPrefixStore],
) -> None:
    r, ps = stack
    lineage(r, ps)
    before = ps.info()["wal_bytes"]
    ps.budget_bytes = 1
    ps._last_write = 0.0
    ps._schedule_compaction(delay=0.01)
    deadline = time.monotonic() + 30
    while ps.stats.compactions == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ps.stats.compactions == 1
    assert (
        ps.info()["wal_bytes"] < before
        and r.info("persistence")["rdb_changes_since_last_save"] == 0
    )


def test_decode_journal(stack: tuple[redis.Redis, PionPrefixStore]) -> None:
    r, ps = stack
    tokens = [3577, 0, 2**32 - 1, 128, 255, 65_000]  # bytes >= 0x80 everywhere
    ps.journal_put(MODEL, "answer-1", tokens)
    assert ps.journal_get(MODEL, "answer-1") == tokens
    key = f"pps:{ps.model_id(MODEL)}:jr:answer-1"
    assert ps.JOURNAL_TTL - 5 <= r.ttl(key) <= ps.JOURNAL_TTL
    # What the client's comment warns about on Pion's server: SET ... EX must not
    # mangle bytes >= 0x80 either.
    raw = np.asarray(tokens, dtype=np.uint32).tobytes()
    r.set(key, raw, ex=60)
    assert r.get(key) == raw
    ps.journal_drop(MODEL, "answer-1")
    assert ps.journal_get(MODEL, "answer-1") is None


def test_lineage_survives_kill9_from_one_log(spawn_server: Callable[..., Any]) -> None:
    srv = spawn_server("--appendfsync", "always")
    r = srv.client()
    ps = PionPrefixStore("127.0.0.1", srv.port, vquant="fp16")
    _root, branch, s1, s2 = lineage(r, ps)
    ps._reset_conn()
    srv.kill()
    srv2 = spawn_server("--appendfsync", "always")
    ps2 = PionPrefixStore("127.0.0.1", srv2.port, vquant="fp16")
    m = ps2.lookup(MODEL, branch)
    assert [s.id for s in m.chain] == [s1, s2] and m.length == 240
    want = expected_rows([(s1, 0, 200), (s2, 150, 240)], 240)
    assert_bit_identical(ps2.fetch_rows(MODEL, m, 0, 240), want)
    ps2._reset_conn()
