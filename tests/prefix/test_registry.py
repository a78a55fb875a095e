"""KV.PREFIX.* and PION.STATS over real TCP with redis-py: reply shapes, receipt
arithmetic, block tables, membership against a set oracle, every error text."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pion.server.run import ServerThread


def stats(r: redis.Redis) -> dict[bytes, object]:
    flat = r.execute_command("PION.STATS")
    return dict(flat) if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True))


def store_rows(r: redis.Redis, ns: str, rows: int, dim: int = 8) -> None:
    blob = np.ones((rows, dim), dtype="<f4").tobytes()
    r.execute_command("V.STOREBATCH", f"{ns}_pk", 0, 0, rows, blob)
    r.execute_command("V.STOREBATCH", f"{ns}_pv", 0, 0, rows, blob)


def u64(values: list[int]) -> bytes:
    return np.asarray(values, dtype="<u8").tobytes()


def test_register_lookup_drop(client: redis.Redis) -> None:
    assert client.execute_command("KV.PREFIX.LOOKUP", "app|v1") == b"MISS"
    assert client.execute_command("KV.PREFIX.REGISTER", "app|v1", 8, "fp16") == b"OK"
    # Idempotent: an existing namespace keeps its layout.
    assert client.execute_command("KV.PREFIX.REGISTER", "app|v1", 16, "int8") == b"OK"
    info = client.execute_command("V.INFO", "app|v1_pk").decode()
    assert "value_dim:8" in info and "v_format:fp16" in info
    assert client.execute_command("KV.PREFIX.LOOKUP", "app|v1") == b"HIT"
    assert client.execute_command("KV.PREFIX.OWNER", "app|v1") == b"0"
    assert client.execute_command("KV.PREFIX.OWNER", "other") == b"-1"
    assert client.execute_command("KV.PREFIX.DROP", "app|v1", "app|v1", "never") == 1
    assert client.execute_command("KV.PREFIX.LOOKUP", "app|v1") == b"MISS"
    assert client.execute_command("KV.PREFIX.DROP", "app|v1") == 0


def test_lookup_miss_when_one_half_missing(client: redis.Redis) -> None:
    client.execute_command("V.CREATE", "half_pk", 8)
    assert client.execute_command("KV.PREFIX.LOOKUP", "half") == b"MISS"
    client.execute_command("V.CREATE", "half_pv", 8)
    assert client.execute_command("KV.PREFIX.LOOKUP", "half") == b"HIT"
    # A half counts for DROP.
    client.execute_command("V.CREATE", "lonely_pv", 8)
    assert client.execute_command("KV.PREFIX.DROP", "lonely") == 1


def test_receipt_measured_prefill(client: redis.Redis) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "p", 8, "fp16", "PREFILL_MS", 1200)
    for _ in range(3):
        assert client.execute_command("KV.PREFIX.LOOKUP", "p") == b"HIT"
    s = stats(client)
    assert s[b"kvprefix_hits"] == 3
    assert s[b"kvprefix_hits_measured"] == 3
    assert s[b"prefill_seconds_avoided"] == b"3.600"
    assert s[b"prefill_seconds_avoided_measured"] == b"3.600"
    assert s[b"kvprefix_prefill_us_saved"] == 3_600_000


def test_receipt_estimate_from_rows(client: redis.Redis) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "e", 8, "fp16")
    store_rows(client, "e", 100)
    client.execute_command("KV.PREFIX.LOOKUP", "e")
    s = stats(client)
    assert s[b"kvprefix_prefill_us_saved"] == 55_500
    assert s[b"kvprefix_hits_measured"] == 0
    assert s[b"kvprefix_tokens_served"] == 100
    assert s[b"prefill_seconds_avoided"] == b"0.055"
    assert s[b"prefill_seconds_avoided_measured"] == b"0.000"
    # A LOOKUP moves no rows: bytes served are what V.FETCH delivers (see below).
    assert s[b"kvprefix_bytes_served"] == 0


def test_receipt_bytes_served_are_fetch_payload_bytes(client: redis.Redis) -> None:
    """Pion's definition: V.FETCH payload bytes delivered (RANGE, id lists, BATCH,
    NATIVE), whichever session they come from; errors and nil replies deliver none."""
    client.execute_command("KV.PREFIX.REGISTER", "f", 8, "fp16")
    store_rows(client, "f", 10)
    client.execute_command("V.CREATE", "plain", 4, "VQUANT", "int8")
    client.execute_command("V.STOREBATCH", "plain", 1, 0, 2, np.ones((2, 4), "<f4").tobytes())
    assert stats(client)[b"kvprefix_bytes_served"] == 0
    expected = 0
    for args, size in [
        (("f_pk", 0, "RANGE", 0, 10), 10 * 8 * 4),
        (("f_pk", 0, "RANGE", 5, 25), 20 * 8 * 4),  # zero rows past tpl are delivered too
        (("f_pv", 0, "RANGE", 0, 10, "FMT", "NATIVE"), 10 * 8 * 2),  # stored fp16
        (("f_pk", 0, 3, 1, 99), 3 * 8 * 4),
        (("f_pk", "BATCH", 0, 4), 4 * 8 * 4),
        (("f_pv", "BATCH", 0, 4, 3, "FMT", "NATIVE"), 4 * 8 * 2),  # layers 1, 2 are nil
        (("plain", "BATCH", 0, 2), 2 * 4 * 4),  # not a prefix namespace: counted too
        (("f_pk", 0, "RANGE", 10, 20), 0),  # nil: nothing delivered
        (("f_pk", 3, "RANGE", 0, 5), 0),  # an empty layer: nil
    ]:
        client.execute_command("V.FETCH", *args)
        expected += size
        assert stats(client)[b"kvprefix_bytes_served"] == expected, args
    with pytest.raises(redis.ResponseError):
        client.execute_command("V.FETCH", "f_pk", 0, "RANGE", 5, 1)
    with pytest.raises(redis.ResponseError):
        client.execute_command("V.FETCH", "gone", 0, "RANGE", 0, 1)
    assert client.execute_command("KV.PREFIX.LOOKUP", "f") == b"HIT"
    s = stats(client)
    assert s[b"kvprefix_bytes_served"] == expected
    assert s[b"kvprefix_tokens_served"] == 10
    info = client.info("pion")
    assert info["kvprefix_bytes_served"] == expected
    client.execute_command("PION.STATS", "RESET")
    assert stats(client)[b"kvprefix_bytes_served"] == 0


def test_receipt_tokens_and_prefill_replacement(client: redis.Redis) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "t", 8, "fp16", "PREFILL_MS", 1000)
    store_rows(client, "t", 10)
    # TOKENS replaces both: tokens = n, time = this call's PREFILL_MS or 0 (estimate).
    client.execute_command("KV.PREFIX.LOOKUP", "t", "TOKENS", 40)
    s = stats(client)
    assert s[b"kvprefix_tokens_served"] == 40
    assert s[b"kvprefix_prefill_us_saved"] == 40 * 555
    assert s[b"kvprefix_hits_measured"] == 0
    client.execute_command("PION.STATS", "RESET")
    client.execute_command("KV.PREFIX.LOOKUP", "t", "TOKENS", 40, "PREFILL_MS", 250)
    s = stats(client)
    assert (s[b"kvprefix_tokens_served"], s[b"kvprefix_prefill_us_measured"]) == (40, 250_000)
    client.execute_command("PION.STATS", "RESET")
    # PREFILL_MS alone replaces the time, tokens stay the namespace's own.
    client.execute_command("KV.PREFIX.LOOKUP", "t", "PREFILL_MS", 70)
    s = stats(client)
    assert (s[b"kvprefix_tokens_served"], s[b"kvprefix_prefill_us_saved"]) == (10, 70_000)
    # Re-registering without PREFILL_MS resets it to 0: estimate again.
    client.execute_command("PION.STATS", "RESET")
    client.execute_command("KV.PREFIX.REGISTER", "t", 8, "fp16")
    client.execute_command("KV.PREFIX.LOOKUP", "t")
    assert stats(client)[b"kvprefix_prefill_us_saved"] == 10 * 555


@pytest.mark.parametrize(
    "args",
    [
        ("TOKENS",),
        ("TOKENS", "x"),
        ("TOKENS", "-1"),
        ("PREFILL_MS", "86400001"),
        ("BOGUS", "1"),
        ("TOKENS", "5", "PREFILL_MS"),
    ],
)
def test_bad_lookup_option_records_nothing(client: redis.Redis, args: tuple[str, ...]) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "b", 8, "fp16")
    with pytest.raises(redis.ResponseError):
        client.execute_command("KV.PREFIX.LOOKUP", "b", *args)
    with pytest.raises(redis.ResponseError):
        client.execute_command("KV.PREFIX.LOOKUP", "nothere", *args)
    s = stats(client)
    assert s[b"kvprefix_hits"] == 0 and s[b"kvprefix_misses"] == 0


def test_stats_reset_and_shapes(client: redis.Redis, client3: redis.Redis) -> None:
    client.execute_command("KV.PREFIX.LOOKUP", "x")
    flat = client.execute_command("PION.STATS")
    assert isinstance(flat, list) and len(flat) == 32
    assert flat[0::2] == [
        b"worker_id",
        b"uptime_in_seconds",
        b"kvprefix_hits",
        b"kvprefix_misses",
        b"kvprefix_hits_measured",
        b"kvprefix_tokens_served",
        b"kvprefix_bytes_served",
        b"kvprefix_prefill_us_saved",
        b"kvprefix_prefill_us_measured",
        b"prefill_seconds_avoided",
        b"prefill_seconds_avoided_measured",
        b"semantic_hits",
        b"semantic_misses",
        b"moe_hits",
        b"moe_misses",
        b"vector_queries",
    ]
    as_map = client3.execute_command("PION.STATS")
    assert isinstance(as_map, dict) and as_map[b"kvprefix_misses"] == 1
    assert client.execute_command("PION.STATS", "RESET") == b"OK"
    assert stats(client)[b"kvprefix_misses"] == 0
    client.execute_command("KV.PREFIX.LOOKUP", "x")
    assert client.config_resetstat()
    assert stats(client)[b"kvprefix_misses"] == 0
    with pytest.raises(redis.ResponseError, match="RESET"):
        client.execute_command("PION.STATS", "RESTE")


def test_info_pion_section(client: redis.Redis) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "i", 8, "fp16", "PREFILL_MS", 500)
    client.execute_command("KV.PREFIX.LOOKUP", "i")
    raw = redis.Redis(port=client.connection_pool.connection_kwargs["port"])
    raw.set_response_callback("INFO", lambda r, **kw: r)
    text = raw.execute_command("INFO", "pion").decode()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    keys = [ln.split(":")[0] for ln in lines]
    assert keys[:2] == ["stats_scope", "worker_id"]
    assert "uptime_in_seconds" not in keys and not any(k.endswith("_us_measured") for k in keys)
    assert "prefill_seconds_avoided:0.500" in lines
    assert text.startswith("# Pion")
    assert client.info("pion")["kvprefix_hits"] == 1
    assert "kvprefix_hits" in client.info()


def test_kv_prefix_info_fields(client: redis.Redis, server: ServerThread) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "a", 8, "fp16")
    client.execute_command("KV.PREFIX.REGISTER", "b", 8, "int8")
    store_rows(client, "a", 5)
    text = client.execute_command("KV.PREFIX.INFO").decode()
    pairs = [ln.split(":", 1) for ln in text.split("\r\n") if ln]
    assert [k for k, _ in pairs] == [
        "registered_prefixes",
        "total_prefix_tokens",
        "vstore_sessions",
        "vstore_total_fetches",
        "vstore_evictions",
        "vstore_max_sessions",
        "vstore_bytes",
        "wal_enabled",
        "wal_bytes",
        "wal_appended",
        "wal_replayed",
        "directory_enabled",
        "my_worker_id",
        "directory_entries",
        "sdpa_warm",
        "sdpa_cold",
        "sdpa_demotions",
        "sdpa_rehydrates",
    ]
    values = dict(pairs)
    assert values["registered_prefixes"] == "2"
    assert values["total_prefix_tokens"] == "5"
    assert values["vstore_sessions"] == "4"
    assert values["vstore_bytes"] == str(2 * 5 * 8 * 2)
    assert values["vstore_bytes"] == str(server.state.vstore.vstore_bytes)


def test_blocks_round_trip(client: redis.Redis) -> None:
    hashes = [2**64 - 1, 0, 12345, 2**63]
    client.execute_command("KV.PREFIX.REGISTER", "blk", 8, "fp16", "BLOCKS", 64, 4, u64(hashes))
    body = client.execute_command("KV.PREFIX.BLOCKS", "blk")
    bs, count = struct.unpack_from("<II", body)
    assert (bs, count) == (64, 4)
    assert list(np.frombuffer(body, "<u8", offset=8)) == hashes
    # Re-register replaces the table; an empty table is still a table.
    client.execute_command("KV.PREFIX.REGISTER", "blk", 8, "fp16", "BLOCKS", 16, 0, b"")
    assert client.execute_command("KV.PREFIX.BLOCKS", "blk") == struct.pack("<II", 16, 0)
    client.execute_command("KV.PREFIX.REGISTER", "plain", 8, "fp16")
    assert client.execute_command("KV.PREFIX.BLOCKS", "plain") == b"UNKNOWN"
    assert client.execute_command("KV.PREFIX.BLOCKS", "never") == b"UNKNOWN"
    assert client.execute_command("KV.PREFIX.MEMBERSHIP", "plain", 1, u64([1])) == b"UNKNOWN"
    assert client.execute_command("KV.PREFIX.MEMBERSHIP", "never", 0, b"") == b"UNKNOWN"


def membership(r: redis.Redis, ns: str, probes: list[int]) -> list[bool]:
    bitmap = r.execute_command("KV.PREFIX.MEMBERSHIP", ns, len(probes), u64(probes))
    assert len(bitmap) == (len(probes) + 7) // 8
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    return [bool(b) for b in bits[: len(probes)]]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    table=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 20), max_size=60),
    probes=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 20), max_size=60),
)
def test_membership_matches_set_oracle(
    client: redis.Redis, table: list[int], probes: list[int]
) -> None:
    client.execute_command(
        "KV.PREFIX.REGISTER", "m", 8, "fp16", "BLOCKS", 16, len(table), u64(table)
    )
    oracle = set(table)
    if probes:
        assert membership(client, "m", probes) == [p in oracle for p in probes]
    else:
        assert client.execute_command("KV.PREFIX.MEMBERSHIP", "m", 0, b"") == b""


@pytest.mark.parametrize("count", [1, 7, 8, 9, 1562])
def test_membership_bitmap_sizes(client: redis.Redis, count: int) -> None:
    rng = np.random.default_rng(count)
    table = rng.integers(0, 2**63, size=count, dtype=np.uint64)
    client.execute_command(
        "KV.PREFIX.REGISTER", "s", 8, "fp16", "BLOCKS", 64, count, table.astype("<u8").tobytes()
    )
    probes = np.concatenate(
        [table[::2], rng.integers(2**63, 2**64 - 1, size=count // 2 + 1, dtype=np.uint64)]
    )
    got = membership(client, "s", [int(p) for p in probes])
    assert got == [True] * len(table[::2]) + [False] * (count // 2 + 1)


def test_membership_max_count(client: redis.Redis) -> None:
    n = 1_048_576
    table = np.arange(n, dtype="<u8") * 3
    client.execute_command("KV.PREFIX.REGISTER", "big", 8, "fp16", "BLOCKS", 64, n, table.tobytes())
    probes = np.arange(n, dtype="<u8")
    bitmap = client.execute_command("KV.PREFIX.MEMBERSHIP", "big", n, probes.tobytes())
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    assert np.array_equal(bits.astype(bool), probes % 3 == 0)
    with pytest.raises(
        redis.ResponseError, match=re.escape("hash_count out of range (0..1048576)")
    ):
        client.execute_command("KV.PREFIX.MEMBERSHIP", "big", n + 1, b"")


ERRORS = [
    (("KV.PREFIX.REGISTER", "", 8, "fp16"), "ns_key length must be 1..200"),
    (("KV.PREFIX.REGISTER", "x" * 201, 8, "fp16"), "ns_key length must be 1..200"),
    (("KV.PREFIX.REGISTER", "n", 0, "fp16"), "kv_dim out of range"),
    (("KV.PREFIX.REGISTER", "n", 8193, "fp16"), "kv_dim out of range"),
    (("KV.PREFIX.REGISTER", "n", "08", "fp16"), "value is not an integer or out of range"),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "q4"),
        "KV.PREFIX.REGISTER: unknown vquant 'q4' (want int8|turbo4|turbo3|turbo2|fp16|fp8|mlx4g32)",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "BLOCKS", 64),
        "BLOCKS requires: block_size hash_count hash_blob",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "BLOCKS", 0, 0, b""),
        "BLOCKS block_size out of range (1..8192)",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "BLOCKS", 8193, 0, b""),
        "BLOCKS block_size out of range (1..8192)",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "BLOCKS", 64, 1048577, b""),
        "BLOCKS hash_count out of range (0..1048576)",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "BLOCKS", 64, -1, b""),
        "BLOCKS hash_count out of range (0..1048576)",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "BLOCKS", 64, 2, b"x" * 15),
        "hash_blob length mismatch",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "PREFILL_MS", -1),
        "PREFILL_MS out of range (0..86400000)",
    ),
    (
        ("KV.PREFIX.REGISTER", "n", 8, "fp16", "PREFILL_MS", 86400001),
        "PREFILL_MS out of range (0..86400000)",
    ),
    (("KV.PREFIX.REGISTER", "n", 8, "fp16", "NOPE"), "unknown option"),
    (("KV.PREFIX.MEMBERSHIP", "n", 2, b"x" * 8), "hash_blob length mismatch"),
    (("KV.PREFIX.MEMBERSHIP", "n", -1, b""), "hash_count out of range (0..1048576)"),
    (("KV.PREFIX.LOOKUP", "x" * 201), "ns_key length must be 1..200"),
    (("KV.PREFIX.LOOKUP", ""), "ns_key length must be 1..200"),
    (("KV.PREFIX.LOOKUP", "", "TOKENS", 1), "ns_key length must be 1..200"),
    (("KV.PREFIX.DROP", ""), "ns_key length must be 1..200"),
]


@pytest.mark.parametrize(("args", "message"), ERRORS, ids=[m for _, m in ERRORS])
def test_error_texts_and_nothing_applied(
    client: redis.Redis, args: tuple[object, ...], message: str
) -> None:
    with pytest.raises(redis.ResponseError, match=re.escape(message)):
        client.execute_command(*args)
    assert client.execute_command("KV.PREFIX.LOOKUP", "n") == b"MISS"
    assert b"registered_prefixes:0" in client.execute_command("KV.PREFIX.INFO")
