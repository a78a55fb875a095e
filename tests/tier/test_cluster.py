"""Two pion-servers (subprocesses, separate data directories) sharing a real 3-node
Redis Cluster as their second tier: what one node stores, the other serves, bit-exact;
BLOCKS and MEMBERSHIP answer on the other node; a DROP anywhere is seen everywhere; a
dead node's writes stay served."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis
from pion_testing.redis_nodes import RedisCluster3
from pion_vllm_mlx import prompt_cache

from pion.client import PionPromptCache
from pion.tier import KeyLayout
from support import fetch_prefix, rows, store_prefix, tier_info, wait_until

FORMATS = ["fp16", "int8", "fp8", "mlx4g32", "turbo4", "turbo3", "turbo2"]
Start = Callable[..., Any]


def _vinfo(r: redis.Redis, sid: str) -> list[bytes]:
    """V.INFO of a session without its slot (a per-node detail)."""
    text: bytes = r.execute_command("V.INFO", sid)
    return [line for line in text.split(b"\r\n") if not line.startswith(b"session_idx")]


def _stats(r: redis.Redis) -> dict[bytes, Any]:
    reply = r.execute_command("PION.STATS")
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))


def test_stored_on_a_is_a_hit_on_b_and_fetches_bit_exact(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    for i, fmt in enumerate(FORMATS):
        store_prefix(ra, f"ns-{fmt}", fmt=fmt, seed=10 * i)
    for fmt in FORMATS:
        ns = f"ns-{fmt}"
        assert rb.execute_command("KV.PREFIX.LOOKUP", ns) == b"HIT"
        assert fetch_prefix(rb, ns) == fetch_prefix(ra, ns), fmt
        for sid in (f"{ns}_pk", f"{ns}_pv"):
            assert _vinfo(rb, sid) == _vinfo(ra, sid)
            rng = ("V.FETCH", sid, 2, "RANGE", 250, 590)
            assert rb.execute_command(*rng) == ra.execute_command(*rng)
            ids = ("V.FETCH", sid, 1, 0, 255, 256, 599, 600)
            assert rb.execute_command(*ids) == ra.execute_command(*ids)
    # Each namespace was filled from the tier once (by its LOOKUP), every stored byte.
    fields = _stats(rb)
    held = int(tier_info(rb)["tier_bytes_in"])
    assert fields[b"tier_hits"] == len(FORMATS)
    assert fields[b"tier_bytes_in"] == held == int(ra.info("memory")["vstore_bytes"])
    assert fields[b"kvprefix_hits"] == len(FORMATS)
    assert fields[b"kvprefix_tokens_served"] == 600 * len(FORMATS)


def test_schema_sparse_and_opaque_fp16_sessions_fill_bit_exact(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    specs = ["fmt=fp16,dim=32", "fmt=int8,dim=64", "fmt=turbo4,dim=128", "fmt=mlx4g32,dim=40"]
    assert ra.execute_command("V.CREATE", "mixed", 0, "SCHEMA", 4, *specs) == 0
    for layer, dim in enumerate((32, 64, 128, 40)):
        ra.execute_command("V.STOREBATCH", "mixed", layer, 0, 300, rows(300, dim, layer).tobytes())
    # A hole: rows 10..1000 of layer 1 were never written (zeros), rows past 1000 were.
    ra.execute_command("V.STOREBATCH", "mixed", 1, 1000, 20, rows(20, 64, 9).tobytes())
    # fp16 patterns that are not fp16 numbers (bf16 bits, NaN payloads) stay verbatim.
    opaque = np.random.default_rng(3).integers(0, 2**16, (70, 32), dtype=np.uint16)
    ra.execute_command("V.STOREBATCH", "mixed", 0, 400, 70, opaque.tobytes(), "FMT", "F16")
    want = ra.execute_command("V.FETCH", "mixed", "BATCH", 0, 1100, "FMT", "NATIVE")
    assert rb.execute_command("V.FETCH", "mixed", "BATCH", 0, 1100, "FMT", "NATIVE") == want
    assert _vinfo(rb, "mixed") == _vinfo(ra, "mixed")
    native = rb.execute_command("V.FETCH", "mixed", 0, "RANGE", 400, 470, "FMT", "NATIVE")
    assert native == opaque.tobytes()


def test_blocks_and_membership_answer_on_b(cluster: RedisCluster3, tier_server: Start) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    table = np.arange(1000, 1050, dtype="<u8")
    ra.execute_command("KV.PREFIX.REGISTER", "blk", 64, "int8", "BLOCKS", 16, 50, table.tobytes())
    probes = np.array([1000, 7, 1049, 1050], dtype="<u8")
    assert rb.execute_command("KV.PREFIX.BLOCKS", "blk") == ra.execute_command(
        "KV.PREFIX.BLOCKS", "blk"
    )
    member = rb.execute_command("KV.PREFIX.MEMBERSHIP", "blk", 4, probes.tobytes())
    assert member == bytes([0b0101])
    # MEMBERSHIP as the first command on a third node fills it too.
    c = tier_server(cluster.url, "c").client()
    assert c.execute_command("KV.PREFIX.MEMBERSHIP", "blk", 4, probes.tobytes()) == member
    assert c.execute_command("KV.PREFIX.BLOCKS", "nowhere") == b"UNKNOWN"


def test_drop_on_a_is_seen_by_b_and_drop_on_b_by_a(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    store_prefix(ra, "gone")
    assert rb.execute_command("KV.PREFIX.LOOKUP", "gone") == b"HIT"  # B holds a copy now
    assert ra.execute_command("KV.PREFIX.DROP", "gone") == 1
    assert rb.execute_command("KV.PREFIX.LOOKUP", "gone") == b"MISS"
    with pytest.raises(redis.ResponseError, match="session not found"):
        rb.execute_command("V.FETCH", "gone_pk", "BATCH", 0, 10)
    assert int(tier_info(rb)["tier_invalidations"]) == 1
    # B drops a namespace only the tier and A hold: A's copy is retired too.
    store_prefix(ra, "also")
    assert rb.execute_command("KV.PREFIX.DROP", "also", "never-was") == 1
    assert ra.execute_command("KV.PREFIX.LOOKUP", "also") == b"MISS"
    assert rb.execute_command("KV.PREFIX.LOOKUP", "also") == b"MISS"


def test_register_on_b_keeps_the_layout_a_registered(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    store_prefix(ra, "lay", fmt="fp8", dim=64)
    # Idempotent REGISTER: B takes the namespace (and its rows) as A registered it.
    assert rb.execute_command("KV.PREFIX.REGISTER", "lay", 32, "int8") == b"OK"
    assert b"v_format:fp8" in rb.execute_command("V.INFO", "lay_pk")
    assert fetch_prefix(rb, "lay") == fetch_prefix(ra, "lay")


def test_rows_b_appends_reach_a_third_node(cluster: RedisCluster3, tier_server: Start) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    store_prefix(ra, "grow", layers=1)
    more = rows(100, 64, 77).tobytes()
    rb.execute_command("V.STOREBATCH", "grow_pk", 0, 600, 100, more)  # fills, then appends
    c = tier_server(cluster.url, "c").client()
    assert c.execute_command("V.FETCH", "grow_pk", 0, "RANGE", 0, 700) == rb.execute_command(
        "V.FETCH", "grow_pk", 0, "RANGE", 0, 700
    )


def test_kill_a_and_b_still_serves_what_a_wrote(cluster: RedisCluster3, tier_server: Start) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra = a.client()
    for i in range(3):
        store_prefix(ra, f"kept{i}", fmt=FORMATS[i], seed=i)
    want = [fetch_prefix(ra, f"kept{i}") for i in range(3)]
    a.kill()
    rb = b.client()
    for i in range(3):
        assert rb.execute_command("KV.PREFIX.LOOKUP", f"kept{i}") == b"HIT"
        assert fetch_prefix(rb, f"kept{i}") == want[i]


def test_async_writes_drain_and_serve_on_b(cluster: RedisCluster3, tier_server: Start) -> None:
    a = tier_server(cluster.url, "a", "--tier-write", "async")
    b = tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    store_prefix(ra, "behind", fmt="int8")
    wait_until(lambda: int(tier_info(ra)["tier_queue_depth"]) == 0, what="A's queue to drain")
    info = tier_info(ra)
    assert info["tier_write"] == "async" and info["tier_mode"] == "cluster"
    assert int(info["tier_writes_applied"]) == 2 + 6  # two creates, six stores
    assert fetch_prefix(rb, "behind") == fetch_prefix(ra, "behind")


def test_pion_clients_on_two_nodes(cluster: RedisCluster3, tier_server: Start) -> None:
    """Pion's own client (pion-vllm-mlx) stores through A and restores through B; our
    PionPromptCache reads the same rows back."""
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ns = prompt_cache.PionPromptCache.make_namespace("model", "tok", "prompt")
    on_a = prompt_cache.PionPromptCache(model=None, host="127.0.0.1", port=a.port)
    on_b = prompt_cache.PionPromptCache(model=None, host="127.0.0.1", port=b.port)
    try:
        assert on_a.resp.call("KV.PREFIX.REGISTER", ns, "128", "fp16").startswith(b"+OK")
        layers = [rows(37, 128, seed) for seed in range(4)]
        for li, values in enumerate(layers):
            on_a._storebatch(ns + "_pk", li, values)
            on_a._storebatch(ns + "_pv", li, values * 2)
        assert on_b.lookup(ns)
        got = on_b._fetch_batch_all_layers(ns + "_pv", 37, 4, native_dim=128)
        for li in range(4):
            np.testing.assert_array_equal(got[li], (layers[li] * 2).astype(np.float16).ravel())
    finally:
        on_a.resp.sock.close()
        on_b.resp.sock.close()
    with PionPromptCache("127.0.0.1", b.port) as ours:
        keys, _ = ours.fetch(ns)
        np.testing.assert_array_equal(keys[3], layers[3].astype(np.float16).astype(np.float32))


def test_an_incomplete_or_foreign_tier_copy_is_refused_not_served(
    cluster: RedisCluster3, tier_server: Start, prefix: str
) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    store_prefix(ra, "hurt")
    keys = KeyLayout(prefix)
    rc = cluster.client()
    gen = rc.hget(keys.meta(b"hurt_pv"), "gen").decode()
    # The cluster evicted one row chunk (as maxmemory-policy may): B must notice.
    assert rc.delete(keys.chunk(b"hurt_pv", gen, 1, 1)) == 1
    with pytest.raises(redis.ResponseError, match="tier's copy of the session is incomplete"):
        rb.execute_command("V.FETCH", "hurt_pk", "BATCH", 0, 600)
    assert rb.execute_command("KV.PREFIX.LOOKUP", "hurt") == b"MISS"
    assert int(tier_info(rb)["tier_incomplete"]) >= 1
    # The broken copy is dropped from the tier, so a writer can store it afresh.
    wait_until(lambda: not rc.exists(keys.meta(b"hurt_pv")), what="the repair drop")
    # A meta someone else wrote in our key space: refused with a clear error.
    rc.hset(keys.meta(b"odd_pk"), mapping={"ver": "9", "gen": "0" * 16, "sid": "odd_pk"})
    with pytest.raises(redis.ResponseError, match=r"cannot be used.*version"):
        rb.execute_command("V.INFO", "odd_pk")
    assert rb.execute_command("KV.PREFIX.LOOKUP", "odd") == b"MISS"
    assert rb.ping()
    rc.close()


def test_hostile_session_ids_never_reach_the_tier(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    b = tier_server(cluster.url, "b")
    rb = b.client()
    rb.execute_command("KV.PREFIX.LOOKUP", "warm-up")  # connects: one meta read
    before = int(tier_info(rb)["tier_read_ops"])
    for sid in (b"x" * 100_000, b""):
        with pytest.raises(redis.ResponseError, match="session not found"):
            rb.execute_command("V.FETCH", sid, 0, "RANGE", 0, 1)
    assert int(tier_info(rb)["tier_read_ops"]) == before
    # Odd bytes of a valid length are asked for (hex in the key), and simply not there.
    misses = int(tier_info(rb)["tier_misses"])
    with pytest.raises(redis.ResponseError, match="session not found"):
        rb.execute_command("V.FETCH", b"\x00{x}\r\n\xff_pk", 0, "RANGE", 0, 1)
    assert int(tier_info(rb)["tier_misses"]) == misses + 1


def test_a_rollback_on_a_cuts_the_tier_copy(cluster: RedisCluster3, tier_server: Start) -> None:
    a = tier_server(cluster.url, "a")
    ra = a.client()
    ra.execute_command("V.CREATE", "draft", 64, "VQUANT", "int8")
    ra.execute_command("V.STOREBATCH", "draft", 0, 0, 600, rows(600, 64, 1).tobytes())
    snap = ra.execute_command("V.SNAPSHOT", "draft")
    ra.execute_command("V.STOREBATCH", "draft", 0, 600, 300, rows(300, 64, 2).tobytes())
    ra.execute_command("V.STOREBATCH", "draft", 1, 0, 10, rows(10, 64, 3).tobytes())
    assert ra.execute_command("V.RESTORE", "draft", snap) == b"OK"  # the draft is rejected
    # A write past the cut leaves a hole: it must read as zeros, not the rejected rows.
    ra.execute_command("V.STOREBATCH", "draft", 0, 800, 20, rows(20, 64, 4).tobytes())
    want = ra.execute_command("V.FETCH", "draft", "BATCH", 0, 820)
    c = tier_server(cluster.url, "c").client()
    assert c.execute_command("V.FETCH", "draft", "BATCH", 0, 820) == want
    assert _vinfo(c, "draft") == _vinfo(ra, "draft")
    assert b"num_layers:1" in c.execute_command("V.INFO", "draft")  # layer 1 went too


def test_rope_layers_fill_bit_exact(cluster: RedisCluster3, tier_server: Start) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    specs = ["fmt=bf16_rope_fp8_body,dim=96,rope=32", "fmt=fp16,dim=64"]
    ra.execute_command("V.CREATE", "mla_pk", 0, "SCHEMA", 2, *specs)
    ra.execute_command("V.STOREBATCH", "mla_pk", 0, 0, 300, rows(300, 96, 5).tobytes())
    ra.execute_command("V.STOREBATCH", "mla_pk", 1, 0, 300, rows(300, 64, 6).tobytes())
    want = ra.execute_command("V.FETCH", "mla_pk", "BATCH", 0, 300)
    assert rb.execute_command("V.FETCH", "mla_pk", "BATCH", 0, 300) == want
    assert b"layer_0_rope:32" in rb.execute_command("V.INFO", "mla_pk")
