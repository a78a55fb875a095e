"""The WARM / COLD / MISSING state machine end to end over TCP: fill past the WARM
table, +COLD, -COLDMISS, KV.PREFIX.WARM from the V-store, +HIT, the counters in
KV.PREFIX.INFO and INFO, LRU order by last access, the cold registry's overflow
turning into MISS, the byte budget, and WARM's own replies and errors."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import redis

from pion.codecs import get_codec
from pion.server.run import ServerThread
from support.attend import reference

RNG = np.random.default_rng(9)
H, D, N = 2, 16, 40
COLDMISS = "session evicted to cold tier (call KV.PREFIX.WARM)"


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def blob(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def store(client: redis.Redis, sid: str, layer: int, k: np.ndarray, v: np.ndarray) -> None:
    h, n, d = k.shape
    client.execute_command("ATTEND.PREFIX.STORE", sid, layer, h, n, d, blob(k), blob(v))


def lookup(client: redis.Redis, sid: str, layer: int = 0) -> str:
    return str(client.execute_command("ATTEND.PREFIX.LOOKUP", sid, layer).decode())


def query(client: redis.Redis, sid: str, layer: int, q: np.ndarray) -> np.ndarray:
    raw = client.execute_command("ATTEND.PREFIX.QUERY", sid, layer, H, D, 1, blob(q))
    return np.frombuffer(raw, "<f4").reshape(q.shape[0], q.shape[2])


def fields(client: redis.Redis, *command: str) -> dict[str, str]:
    raw = client.execute_command(*command)
    if isinstance(raw, dict):  # redis-py parses INFO itself
        return {str(k): str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def sdpa(client: redis.Redis) -> tuple[int, ...]:
    f = fields(client, "KV.PREFIX.INFO")
    return tuple(int(f[k]) for k in ("sdpa_warm", "sdpa_cold", "sdpa_demotions", "sdpa_rehydrates"))


def register(client: redis.Redis, ns: str, layers: int, fmt: str = "fp16") -> list[np.ndarray]:
    """A namespace whose halves hold ``layers`` layers of [N, H*D] rows; returns the
    rows as the V-store will give them back (decoded)."""
    client.execute_command("KV.PREFIX.REGISTER", ns, H * D, fmt)
    decoded = []
    codec = get_codec(fmt)
    for layer in range(layers):
        for half in ("_pk", "_pv"):
            rows = rand(N, H * D)
            client.execute_command("V.STOREBATCH", ns + half, layer, 0, N, rows.tobytes())
            decoded.append(codec.decode(codec.encode(rows), H * D))
    return decoded


def heads_first(rows: np.ndarray) -> np.ndarray:
    return rows.reshape(N, H, D).transpose(1, 0, 2)


def test_fill_cold_coldmiss_warm_hit(server_factory: Callable[..., ServerThread]) -> None:
    server = server_factory(attend_warm_slots=3, attend_cold_slots=2)
    c = redis.Redis(port=server.port)
    rows = register(c, "ns", 2)
    for layer in range(2):  # the client's layout: <ns>_attn
        store(c, "ns_attn", layer, heads_first(rows[2 * layer]), heads_first(rows[2 * layer + 1]))
    for layer in range(3):
        store(c, "other", layer, rand(H, N, D), rand(H, N, D))
    assert [lookup(c, "ns_attn", i) for i in range(2)] == ["COLD", "COLD"]
    assert sdpa(c) == (3, 2, 2, 0)
    q = rand(H, 1, D)
    with pytest.raises(redis.ResponseError) as cold:
        query(c, "ns_attn", 0, q)
    assert str(cold.value) == f"COLDMISS {COLDMISS}"
    # The exact reply line: -COLDMISS, no ERR prefix.
    with server_socket(server) as sock:
        sock.sendall(b"*7\r\n$19\r\nATTEND.PREFIX.QUERY\r\n$7\r\nns_attn\r\n$1\r\n0\r\n")
        sock.sendall(b"$1\r\n2\r\n$2\r\n16\r\n$1\r\n1\r\n$128\r\n" + blob(q) + b"\r\n")
        assert read_line(sock) == b"-COLDMISS " + COLDMISS.encode() + b"\r\n"

    assert c.execute_command("KV.PREFIX.WARM", "ns", H, D, "ns_attn") == b"2"
    assert [lookup(c, "ns_attn", i) for i in range(2)] == ["HIT", "HIT"]
    # Each rehydrated layer took a slot: other/0 and other/1 were demoted for them.
    assert sdpa(c) == (3, 2, 4, 2)
    assert lookup(c, "other", 0) == "COLD" and lookup(c, "other", 2) == "HIT"
    want = reference(q, heads_first(rows[0]), heads_first(rows[1]))[0][:, 0]
    np.testing.assert_allclose(query(c, "ns_attn", 0, q), want, atol=2e-5)

    # LRU by last access: the LOOKUP of other/2 and the query of ns_attn/0 stamped
    # them, so ns_attn/1 is the victim of the next store...
    store(c, "x", 0, rand(H, N, D), rand(H, N, D))
    assert lookup(c, "ns_attn", 1) == "COLD"
    assert (lookup(c, "ns_attn", 0), lookup(c, "other", 2)) == ("HIT", "HIT")
    # ...and the cold registry (2 entries) forgot its oldest demotion: other/0.
    assert lookup(c, "other", 0) == "MISS" and lookup(c, "other", 1) == "COLD"
    with pytest.raises(redis.ResponseError, match="session not found"):
        query(c, "other", 0, q)
    info = fields(c, "INFO", "stats")
    assert (info["sdpa_warm"], info["sdpa_cold"], info["sdpa_demotions"]) == ("3", "2", "5")
    assert info["sdpa_rehydrates"] == "2" and info["sdpa_cold_forgotten"] == "1"


def test_lookup_touches_and_queries_stamp_most_recent(
    server_factory: Callable[..., ServerThread],
) -> None:
    server = server_factory(attend_warm_slots=2)
    c = redis.Redis(port=server.port)
    store(c, "a", 0, rand(H, N, D), rand(H, N, D))
    store(c, "b", 0, rand(H, N, D), rand(H, N, D))
    query(c, "a", 0, rand(H, 1, D))
    store(c, "c", 0, rand(H, N, D), rand(H, N, D))
    assert (lookup(c, "a"), lookup(c, "b")) == ("HIT", "COLD")
    assert lookup(c, "c") == "HIT"  # c is now most recent, a the victim
    store(c, "d", 0, rand(H, N, D), rand(H, N, D))
    assert (lookup(c, "a"), lookup(c, "c")) == ("COLD", "HIT")


def test_byte_budget(server_factory: Callable[..., ServerThread]) -> None:
    one = 2 * H * N * D * 4
    server = server_factory(attend_maxmemory=2 * one)
    c = redis.Redis(port=server.port)
    for layer in range(3):
        store(c, "s", layer, rand(H, N, D), rand(H, N, D))
    assert lookup(c, "s", 0) == "COLD" and sdpa(c)[:2] == (2, 1)
    memory = fields(c, "INFO", "memory")
    assert memory["sdpa_warm_bytes"] == str(2 * one)
    assert memory["attend_maxmemory"] == str(2 * one)
    with pytest.raises(redis.exceptions.OutOfMemoryError, match="exceed attend-maxmemory"):
        store(c, "big", 0, rand(H, 3 * N, D), rand(H, 3 * N, D))
    assert sdpa(c)[:2] == (2, 1)


@pytest.mark.parametrize("fmt", ["fp16", "int8", "fp8", "turbo4"])
def test_warm_rehydrates_every_format(client: redis.Redis, fmt: str) -> None:
    rows = register(client, f"n-{fmt}", 3, fmt)
    assert client.execute_command("KV.PREFIX.WARM", f"n-{fmt}", H, D) == b"3"  # default sid
    q = rand(H, 4, D)
    for layer in range(3):
        k, v = heads_first(rows[2 * layer]), heads_first(rows[2 * layer + 1])
        raw = client.execute_command("ATTEND.PREFIX.QUERY", f"n-{fmt}", layer, H, D, 1, blob(q))
        got = np.frombuffer(raw, "<f4")[: q.size].reshape(q.shape)
        np.testing.assert_allclose(got, reference(q, k, v)[0], atol=2e-5)


def test_warm_skips_layers_of_another_dim_and_uses_the_shorter_half(
    client: redis.Redis,
) -> None:
    for half in ("_pk", "_pv"):
        client.execute_command(
            "V.CREATE",
            "het" + half,
            0,
            "SCHEMA",
            3,
            "fmt=fp16,dim=32",
            "fmt=fp16,dim=8",
            "fmt=fp16,dim=32",
        )
    client.execute_command("V.STOREBATCH", "het_pk", 0, 0, 10, rand(10, 32).tobytes())
    client.execute_command("V.STOREBATCH", "het_pv", 0, 0, 7, rand(7, 32).tobytes())
    client.execute_command("V.STOREBATCH", "het_pk", 1, 0, 5, rand(5, 8).tobytes())
    client.execute_command("V.STOREBATCH", "het_pv", 1, 0, 5, rand(5, 8).tobytes())
    client.execute_command("V.STOREBATCH", "het_pk", 2, 0, 5, rand(5, 32).tobytes())
    assert client.execute_command("KV.PREFIX.WARM", "het", H, D, "") == b"1 skipped_dim=1"
    q = rand(H, 1, D)
    raw = client.execute_command("ATTEND.PREFIX.QUERY", "het", 0, H, D, 1, blob(q))
    assert len(raw) == H * D * 4  # 7 rows, the shorter half
    assert client.execute_command("ATTEND.PREFIX.LOOKUP", "het", 2) == b"MISS"  # V empty


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["never", H, D],
            "KV.PREFIX.WARM namespace not registered (call KV.PREFIX.REGISTER first)",
        ),
        (["ns", 0, D], "invalid H/D (1..256 / 1..8192)"),
        (["ns", H, 9000], "invalid H/D"),
        (["ns", 300, 1], "invalid H/D"),
        (["x" * 201, H, D], "ns_key length must be 1..200"),
        (["ns", H, D, "sid", "extra"], "syntax error"),
        (["ns", "h", D], "not an integer"),
    ],
)
def test_warm_errors(client: redis.Redis, args: list[Any], message: str) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "ns", H * D, "fp16")
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command("KV.PREFIX.WARM", *args)
    assert message in str(info.value)
    assert sdpa(client) == (0, 0, 0, 0)


# -- raw socket helpers ---------------------------------------------------------------


@contextmanager
def server_socket(server: ServerThread) -> Iterator[socket.socket]:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    try:
        yield sock
    finally:
        sock.close()


def read_line(sock: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        out += chunk
    return out


def test_warm_holds_fp16_rows_at_their_width(client: redis.Redis) -> None:
    """fp16 layers are held as stored (2 bytes a value, shared with the V-store), other
    formats decoded once to fp32; the queries agree with the decoded rows either way."""
    rows16 = register(client, "w16", 2, "fp16")
    register(client, "w8", 1, "int8")
    assert client.execute_command("KV.PREFIX.WARM", "w16", H, D) == b"2"
    assert fields(client, "INFO", "memory")["sdpa_warm_bytes"] == str(2 * 2 * N * H * D * 2)
    assert client.execute_command("KV.PREFIX.WARM", "w8", H, D) == b"1"
    held = 2 * 2 * N * H * D * 2 + 2 * N * H * D * 4
    assert fields(client, "INFO", "memory")["sdpa_warm_bytes"] == str(held)
    # Overwriting the V-store's rows afterwards leaves the slot as it was warmed.
    client.execute_command("V.STOREBATCH", "w16_pk", 1, 0, N, rand(N, H * D).tobytes())
    q = rand(H, 1, D)
    raw = client.execute_command("ATTEND.PREFIX.QUERY", "w16", 1, H, D, 1, blob(q))
    want = reference(q, heads_first(rows16[2]), heads_first(rows16[3]))[0]
    np.testing.assert_allclose(np.frombuffer(raw, "<f4").reshape(H, 1, D), want, atol=2e-5)
