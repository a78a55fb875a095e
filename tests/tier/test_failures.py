"""The tier failing under real processes: a cluster node killed while B serves, a
standalone redis-server going away and coming back, a full write queue, a shutdown
with writes still queued. Requests the local V-store can answer always succeed; the
rest fail with a clear error; queued writes drain and the tier ends up consistent."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from pion_testing.redis_nodes import RedisCluster3, RedisNode

from pion.tier import KeyLayout
from support import fetch_prefix, rows, store_prefix, tier_info, wait_until

Start = Callable[..., Any]


def _down(r: redis.Redis) -> bool:
    return tier_info(r)["tier_status"] == "down"


def _drained(r: redis.Redis) -> bool:
    info = tier_info(r)
    return info["tier_status"] == "ok" and int(info["tier_queue_depth"]) == 0


def _fetches(r: redis.Redis, sid: str) -> bool:
    """One V.FETCH of ``sid``: True when it answers, False while the tier is away."""
    try:
        r.execute_command("V.FETCH", sid, 0, "RANGE", 0, 1)
    except redis.ResponseError as exc:
        if "tier is unavailable" in str(exc):
            return False
        raise
    return True


def test_kill_a_cluster_node_while_b_serves_then_bring_it_back(
    own_cluster: RedisCluster3, tier_server: Start, prefix: str
) -> None:
    c = own_cluster
    a = tier_server(c.url, "a")  # sync writes
    b = tier_server(c.url, "b", "--tier-write", "async")
    ra, rb = a.client(), b.client()
    store_prefix(ra, "held", seed=1)  # B will hold a local copy
    store_prefix(ra, "remote", fmt="int8", seed=2)  # only the tier holds it for B
    want = {ns: fetch_prefix(ra, ns) for ns in ("held", "remote")}
    assert fetch_prefix(rb, "held") == want["held"]
    keys = KeyLayout(prefix)
    victim = c.owner_of(keys.meta(b"remote_pk"))
    # Namespaces written during the outage whose metadata lives on the dead node.
    candidates = (f"late{i}" for i in range(2000))
    late = [ns for ns in candidates if c.owner_of(keys.meta(f"{ns}_pk".encode())) is victim][:2]
    victim.kill()

    # What B holds is served; what only the tier held fails with a clear error.
    assert rb.execute_command("KV.PREFIX.LOOKUP", "held") == b"HIT"
    assert fetch_prefix(rb, "held") == want["held"]
    with pytest.raises(redis.ResponseError, match="not held here and the tier is unavailable"):
        rb.execute_command("V.FETCH", "remote_pk", "BATCH", 0, 600)
    assert rb.execute_command("KV.PREFIX.LOOKUP", "remote") == b"MISS"
    # Writes are accepted locally (sync and async alike) and queued.
    store_prefix(rb, late[0], fmt="fp8", seed=3)
    store_prefix(ra, late[1], fmt="mlx4g32", seed=4)
    want[late[0]], want[late[1]] = fetch_prefix(rb, late[0]), fetch_prefix(ra, late[1])
    for r in (ra, rb):
        info = tier_info(r)
        assert info["tier_status"] == "down" and int(info["tier_queue_depth"]) > 0
        assert int(info["tier_errors"]) > 0 and info["tier_last_error"]
    assert rb.ping() and ra.ping()

    victim.start()
    c.wait_ok()
    wait_until(lambda: _drained(ra) and _drained(rb), timeout=40, what="both queues to drain")
    assert fetch_prefix(rb, "remote") == want["remote"]
    # Consistent: a node that never saw any of it reads everything back bit-exact.
    d = tier_server(c.url, "d").client()
    for ns, expected in want.items():
        assert d.execute_command("KV.PREFIX.LOOKUP", ns) == b"HIT", ns
        assert fetch_prefix(d, ns) == expected, ns


def test_standalone_tier_with_a_password_goes_away_and_comes_back(
    tier_server: Start, tmp_path: Path
) -> None:
    node = RedisNode(password="s3cret word")
    try:
        secret = tmp_path / "tier-password"
        secret.write_text("s3cret word\n")
        a = tier_server(node.url, "a", "--tier-password-file", str(secret), "--tier-write", "async")
        b = tier_server(f"redis://:s3cret%20word@127.0.0.1:{node.port}", "b")
        ra, rb = a.client(), b.client()
        store_prefix(ra, "one")
        wait_until(lambda: _drained(ra), what="A's queue to drain")
        assert tier_info(ra)["tier_mode"] == "standalone"
        assert fetch_prefix(rb, "one") == fetch_prefix(ra, "one")

        node.kill()
        store_prefix(ra, "two", fmt="turbo3")
        wait_until(lambda: _down(ra), what="A to notice")
        assert int(tier_info(ra)["tier_queue_depth"]) > 0
        with pytest.raises(redis.ResponseError, match="tier is unavailable"):
            rb.execute_command("V.FETCH", "two_pv", 0, "RANGE", 0, 10)
        assert fetch_prefix(rb, "one") == fetch_prefix(ra, "one")  # held locally

        node.start()  # same port, its append-only file: the data is back
        wait_until(lambda: _drained(ra), timeout=30, what="A's queue to drain")
        # B has nothing queued: it tries again on demand, once its backoff has passed.
        wait_until(lambda: _fetches(rb, "two_pk"), timeout=10, what="B to use the tier")
        assert fetch_prefix(rb, "two") == fetch_prefix(ra, "two")
    finally:
        node.stop()


def test_a_wrong_tier_password_is_reported_and_the_node_serves_locally(
    tier_server: Start,
) -> None:
    node = RedisNode(password="right")
    try:
        a = tier_server(f"redis://:wrong@127.0.0.1:{node.port}", "a")
        ra = a.client()
        store_prefix(ra, "solo")  # sync: the reply does not wait for a failing tier
        info = tier_info(ra)
        assert info["tier_status"] == "down"
        assert "WRONGPASS" in info["tier_last_error"] or "invalid" in info["tier_last_error"]
        assert ra.execute_command("KV.PREFIX.LOOKUP", "solo") == b"HIT"
        assert len(fetch_prefix(ra, "solo")) == 4
    finally:
        node.stop()


def test_tls_tier(tier_server: Start, tls_cert: tuple[Path, Path]) -> None:
    node = RedisNode(tls=tls_cert)
    try:
        ca = ["--tier-tls-ca", str(tls_cert[0])]
        a = tier_server(node.url, "a", *ca)
        b = tier_server(f"redis://127.0.0.1:{node.port}", "b", "--tier-tls", *ca)
        ra, rb = a.client(), b.client()
        store_prefix(ra, "secure")
        assert tier_info(rb)["tier_tls"] == 1
        assert fetch_prefix(rb, "secure") == fetch_prefix(ra, "secure")
        # Plain text against the TLS port: the tier is down, never silently skipped.
        c = tier_server(f"redis://127.0.0.1:{node.port}", "c", "--tier-timeout", "0.5")
        with pytest.raises(redis.ResponseError, match="tier is unavailable"):
            c.client().execute_command("V.FETCH", "secure_pk", 0, "RANGE", 0, 1)
    finally:
        node.stop()


def test_tls_tier_with_a_client_certificate(
    tier_server: Start, tls_cert: tuple[Path, Path]
) -> None:
    cert, key = tls_cert
    node = RedisNode(tls=tls_cert, extra=["--tls-auth-clients", "yes"])
    try:
        ca = ["--tier-tls-ca", str(cert)]
        a = tier_server(
            node.url, "a", *ca, "--tier-tls-cert", str(cert), "--tier-tls-key", str(key)
        )
        store_prefix(a.client(), "mutual")
        assert int(tier_info(a.client())["tier_writes_applied"]) == 8
        # Without a certificate the server refuses the handshake: down, not skipped.
        b = tier_server(node.url, "b", *ca, "--tier-timeout", "0.5").client()
        with pytest.raises(redis.ResponseError, match="tier is unavailable"):
            b.execute_command("V.FETCH", "mutual_pk", 0, "RANGE", 0, 1)
    finally:
        node.stop()


def test_a_full_queue_becomes_a_resync(tier_server: Start, redis_node: RedisNode) -> None:
    a = tier_server(redis_node.url, "a", "--tier-write", "async", "--tier-queue-max", "64kb")
    b = tier_server(redis_node.url, "b")
    ra, rb = a.client(), b.client()
    redis_node.kill()
    store_prefix(ra, "flood", fmt="fp16", layers=4)  # each layer's rows: 75 KiB
    info = tier_info(ra)
    assert int(info["tier_queue_overflows"]) > 0
    assert int(info["tier_resync_pending"]) >= 1
    assert int(info["tier_queue_bytes"]) <= 64 * 1024
    redis_node.start()
    wait_until(
        lambda: _drained(ra) and int(tier_info(ra)["tier_resync_pending"]) == 0,
        timeout=30,
        what="the resync",
    )
    assert int(tier_info(ra)["tier_resyncs"]) >= 1
    assert fetch_prefix(rb, "flood") == fetch_prefix(ra, "flood")


def test_writes_left_queued_at_shutdown_are_pushed_after_restart(
    tier_server: Start, redis_node: RedisNode
) -> None:
    a = tier_server(redis_node.url, "a", "--tier-write", "async")
    ra = a.client()
    redis_node.kill()
    store_prefix(ra, "stranded", fmt="int8")
    want = fetch_prefix(ra, "stranded")
    assert a.stop() == 0  # SIGTERM: the drain gives up after its timeout
    redis_node.start()
    again = tier_server(redis_node.url, "a")  # same data directory: the WAL has it
    wait_until(
        lambda: int(tier_info(again.client())["tier_resyncs"]) >= 1 and _drained(again.client()),
        timeout=30,
        what="the start-up check to push the session",
    )
    b = tier_server(redis_node.url, "b").client()
    assert fetch_prefix(b, "stranded") == want


def test_a_filled_session_is_a_cache_until_this_node_writes_into_it(
    tier_server: Start, redis_node: RedisNode
) -> None:
    a, b = tier_server(redis_node.url, "a"), tier_server(redis_node.url, "b")
    ra, rb = a.client(), b.client()
    store_prefix(ra, "mine")
    store_prefix(ra, "cache", seed=9)
    want_cache = fetch_prefix(ra, "cache")
    assert fetch_prefix(rb, "cache") == want_cache
    fetch_prefix(rb, "mine")
    rb.execute_command("V.STOREBATCH", "mine_pk", 0, 600, 10, rows(10, 64, 5).tobytes())
    want_mine = rb.execute_command("V.FETCH", "mine_pk", "BATCH", 0, 610)
    b.kill()
    redis_node.kill()
    b = tier_server(redis_node.url, "b")  # same directory, no tier
    rb = b.client()
    # Written here: logged whole, then the write; survives the restart without the tier.
    assert rb.execute_command("V.FETCH", "mine_pk", "BATCH", 0, 610) == want_mine
    # Only read here: a cache of the tier, not in this node's log.
    with pytest.raises(redis.ResponseError, match="tier is unavailable"):
        rb.execute_command("V.FETCH", "cache_pk", "BATCH", 0, 600)
    redis_node.start()
    wait_until(lambda: tier_info(rb)["tier_status"] == "ok", timeout=30, what="the tier")
    assert fetch_prefix(rb, "cache") == want_cache


def test_a_drop_follows_the_queued_writes_of_a_namespace_evicted_here(
    tier_server: Start, redis_node: RedisNode
) -> None:
    a = tier_server(redis_node.url, "a", "--tier-write", "async", "--vstore-max-sessions", "2")
    ra = a.client()
    redis_node.kill()
    store_prefix(ra, "first", layers=1)
    store_prefix(ra, "second", layers=1)  # evicts "first" here; both still queued
    assert ra.execute_command("KV.PREFIX.DROP", "first") == 1
    redis_node.start()
    wait_until(lambda: _drained(ra), timeout=30, what="A's queue to drain")
    b = tier_server(redis_node.url, "b").client()
    assert b.execute_command("KV.PREFIX.LOOKUP", "first") == b"MISS"
    assert b.execute_command("KV.PREFIX.LOOKUP", "second") == b"HIT"
