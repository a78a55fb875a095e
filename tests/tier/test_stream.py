"""V.FETCH of a prefix only the tier holds replies while the fill reads
(``pion.tier.inflight``): bit-exact against the node that wrote it in every format,
RANGE and BATCH, fp32 and NATIVE; the session lands in B's V-store once, whole; a
tier that fails before the first layer is an error reply, after part of the reply
left a cut connection, and either way nothing is half-filled; concurrent clients of
the namespace all get the writer's bytes from one fill."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from pion_testing.redis_nodes import RedisCluster3, RedisNode
from redis.backoff import NoBackoff
from redis.retry import Retry

from support import rows, tier_info, wait_until

Start = Callable[..., Any]
FORMATS = ["fp16", "int8", "fp8", "mlx4g32", "turbo4", "turbo3", "turbo2"]
LAYERS, TOKENS, DIM = 6, 1100, 128  # 1100 rows: four full 256-row chunks and a partial
LAYER_BYTES = TOKENS * DIM * 2  # one fp16 layer as the tier holds it


def _store(r: redis.Redis, ns: str, fmt: str = "fp16", seed: int = 0) -> None:
    assert r.execute_command("KV.PREFIX.REGISTER", ns, DIM, fmt) == b"OK"
    for half, sid in enumerate((f"{ns}_pk", f"{ns}_pv")):
        for layer in range(LAYERS):
            blob = rows(TOKENS, DIM, seed + 100 * half + layer).tobytes()
            r.execute_command("V.STOREBATCH", sid, layer, 0, TOKENS, blob)


def _info(r: redis.Redis, key: str) -> int:
    return int(tier_info(r)[key])


def _vinfo(r: redis.Redis, sid: str) -> list[bytes]:
    text: bytes = r.execute_command("V.INFO", sid)
    return [line for line in text.split(b"\r\n") if not line.startswith(b"session_idx")]


FORMS: list[tuple[Any, ...]] = [
    ("BATCH", 0, TOKENS, "FMT", "NATIVE"),
    ("BATCH", 0, TOKENS),
    ("BATCH", 300, 900, 4),
    (3, "RANGE", 250, 1100),
    (5, "RANGE", 1000, 1300, "FMT", "NATIVE"),
    (2, "RANGE", 1100, 1200),  # no row from 1100: nil
]


def test_a_fetch_that_fills_streams_bit_exact_in_every_format(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    a = tier_server(cluster.url, "a")
    # One namespace at a time on B: fetching the other one evicts it, so every fetch
    # of a form below is a fill from the tier.
    b = tier_server(cluster.url, "b", "--vstore-max-sessions", "2")
    ra, rb = a.client(), b.client()
    _store(ra, "other", seed=999)
    for i, fmt in enumerate(FORMATS):
        _store(ra, f"s-{fmt}", fmt, seed=7 * i)
    for fmt in FORMATS:
        ns = f"s-{fmt}"
        for k, form in enumerate(FORMS):
            wait_until(lambda: _info(rb, "tier_fills_in_flight") == 0, what="the last commit")
            rb.execute_command("V.FETCH", "other_pk", 0, "RANGE", 0, 1)
            wait_until(lambda: _info(rb, "tier_fills_in_flight") == 0, what="its commit")
            streamed = _info(rb, "tier_streamed_fills")
            sid = f"{ns}_pk" if k % 2 else f"{ns}_pv"
            want = ra.execute_command("V.FETCH", sid, *form)
            assert rb.execute_command("V.FETCH", sid, *form) == want, (fmt, form)
            assert _info(rb, "tier_streamed_fills") == streamed + 1, (fmt, form)
        # The last fill landed whole: B serves both halves as A does, from its V-store.
        for sid in (f"{ns}_pk", f"{ns}_pv"):
            assert _vinfo(rb, sid) == _vinfo(ra, sid)
        streamed = _info(rb, "tier_streamed_fills")
        assert rb.execute_command("V.FETCH", f"{ns}_pk", *FORMS[1]) == ra.execute_command(
            "V.FETCH", f"{ns}_pk", *FORMS[1]
        )
        assert _info(rb, "tier_streamed_fills") == streamed  # local now
    assert _info(rb, "tier_fills_in_flight") == 0


def test_every_byte_fills_once_and_bounds_are_the_local_ones(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    _store(ra, "once")
    # Errors a local fetch gives, given before any of the tier's rows go out.
    with pytest.raises(redis.ResponseError, match="rows out of range"):
        rb.execute_command("V.FETCH", "once_pk", "BATCH", 0, 10**9)
    with pytest.raises(redis.ResponseError, match="zero fill is limited"):
        rb.execute_command("V.FETCH", "once_pk", 0, "RANGE", 0, 200_000)
    with pytest.raises(redis.ResponseError, match="layer_id out of range"):
        rb.execute_command("V.FETCH", "once_pk", 100_000, "RANGE", 0, 10)
    want = ra.execute_command("V.FETCH", "once_pv", "BATCH", 0, TOKENS, "FMT", "NATIVE")
    assert rb.execute_command("V.FETCH", "once_pv", "BATCH", 0, TOKENS, "FMT", "NATIVE") == want
    wait_until(lambda: _info(rb, "tier_fills_in_flight") == 0, what="the commit")
    assert _info(rb, "tier_hits") == 1
    held = int(rb.info("memory")["vstore_bytes"])
    assert held == _info(rb, "tier_bytes_in") == int(ra.info("memory")["vstore_bytes"])


def test_concurrent_clients_share_one_fill(cluster: RedisCluster3, tier_server: Start) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra = a.client()
    for n in range(3):
        _store(ra, f"c{n}", seed=50 * n)
    want = {
        (ns, half): ra.execute_command("V.FETCH", f"{ns}_{half}", "BATCH", 0, TOKENS)
        for ns in ("c0", "c1", "c2")
        for half in ("pk", "pv")
    }
    start = threading.Barrier(9)

    def client(n: int) -> list[bool]:
        r = b.client()
        start.wait()
        ns = f"c{n % 3}"
        out = []
        for half in ("pk", "pv") if n % 2 else ("pv", "pk"):
            got = r.execute_command("V.FETCH", f"{ns}_{half}", "BATCH", 0, TOKENS)
            out.append(got == want[ns, half])
        out.append(r.execute_command("KV.PREFIX.LOOKUP", ns) == b"HIT")
        r.close()
        return out

    with ThreadPoolExecutor(9) as pool:
        results = list(pool.map(client, range(9)))
    assert all(all(r) for r in results), results
    rb = b.client()
    wait_until(lambda: _info(rb, "tier_fills_in_flight") == 0, what="the commits")
    assert _info(rb, "tier_hits") == 3  # each namespace filled once
    assert int(rb.info("memory")["vstore_bytes"]) == int(ra.info("memory")["vstore_bytes"])


class _CuttingProxy:
    """A TCP relay in front of a redis-server that, while armed, closes the first
    connection whose replies pass ``cut_after`` bytes (a tier failing mid-read)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.cut_after: int | None = None
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        sent = 0
        try:
            while data := src.recv(1 << 16):
                limit = self.cut_after
                if replies and limit is not None and sent + len(data) > limit:
                    dst.sendall(data[: limit - sent])
                    self.cut_after = None
                    self.cuts += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("cut", ["before the first layer", "after the first layer"])
def test_a_tier_failing_during_the_fill(
    redis_node: RedisNode, tier_server: Start, cut: str
) -> None:
    proxy = _CuttingProxy(redis_node.port)
    try:
        a = tier_server(redis_node.url, "a")
        b = tier_server(f"redis://127.0.0.1:{proxy.port}", "b", "--tier-timeout", "1")
        # No retry: redis-py would otherwise resend a command whose connection dropped.
        ra, rb = a.client(), b.client(retry=Retry(NoBackoff(), 0))
        _store(ra, "cut")
        want = ra.execute_command("V.FETCH", "cut_pk", "BATCH", 0, TOKENS, "FMT", "NATIVE")
        rb.ping()
        # The read of the rows is the connection's first large reply: cut it inside
        # layer 0 (nothing of the reply sent yet) or inside layer 1 (layer 0 sent).
        proxy.cut_after = LAYER_BYTES // 2 if cut.startswith("before") else LAYER_BYTES * 3 // 2
        if cut.startswith("before"):
            with pytest.raises(redis.ResponseError, match="tier"):
                rb.execute_command("V.FETCH", "cut_pk", "BATCH", 0, TOKENS, "FMT", "NATIVE")
            assert rb.ping()  # an error reply: the connection goes on
        else:
            with pytest.raises(redis.ConnectionError):
                rb.execute_command("V.FETCH", "cut_pk", "BATCH", 0, TOKENS, "FMT", "NATIVE")
        assert proxy.cuts == 1
        rb = b.client()
        wait_until(lambda: _info(rb, "tier_fills_in_flight") == 0, what="the failed fill")
        # Nothing half-filled: B holds no row of it, and counted no fill.
        assert int(rb.info("memory")["vstore_bytes"]) == 0
        assert _info(rb, "tier_hits") == 0

        # The tier back (the backoff over): the next fetch fills it, bit-exact.
        def fetched() -> bool:
            try:
                got = rb.execute_command("V.FETCH", "cut_pk", "BATCH", 0, TOKENS, "FMT", "NATIVE")
            except redis.ResponseError:
                return False
            return bool(got == want)

        wait_until(fetched, what="a fill once the tier is back")
        assert _vinfo(rb, "cut_pv") == _vinfo(ra, "cut_pv")
    finally:
        proxy.close()


def _read_reply(sock: socket.socket) -> list[bytes]:
    """An array of bulk strings, read off a raw socket."""
    buf = bytearray()

    def line() -> bytes:
        while b"\r\n" not in buf:
            buf.extend(sock.recv(1 << 20))
        at = buf.index(b"\r\n")
        out = bytes(buf[:at])
        del buf[: at + 2]
        return out

    head = line()
    assert head.startswith(b"*"), head
    out = []
    for _ in range(int(head[1:])):
        size = int(line()[1:])
        while len(buf) < size + 2:
            buf.extend(sock.recv(1 << 20))
        out.append(bytes(buf[:size]))
        del buf[: size + 2]
    return out


def test_a_write_while_a_reply_streams_never_changes_that_reply(
    cluster: RedisCluster3, tier_server: Start
) -> None:
    a, b = tier_server(cluster.url, "a"), tier_server(cluster.url, "b")
    ra, rb = a.client(), b.client()
    layers, tokens, dim = 16, 2048, 512  # 32 MiB a half: more than the sockets buffer
    assert ra.execute_command("KV.PREFIX.REGISTER", "w", dim, "fp16") == b"OK"
    for layer in range(layers):
        blob = rows(tokens, dim, layer).astype("<f2").tobytes()
        ra.execute_command("V.STOREBATCH", "w_pk", layer, 0, tokens, blob, "FMT", "F16")
    ra.execute_command("V.STOREBATCH", "w_pv", 0, 0, 1, rows(1, dim, 99).tobytes())
    want = ra.execute_command("V.FETCH", "w_pk", "BATCH", 0, tokens, "FMT", "NATIVE")
    reader = socket.create_connection(("127.0.0.1", b.port))
    try:
        reader.sendall(b"*7\r\n$7\r\nV.FETCH\r\n$4\r\nw_pk\r\n$5\r\nBATCH\r\n$1\r\n0\r\n")
        reader.sendall(b"$4\r\n%d\r\n$3\r\nFMT\r\n$6\r\nNATIVE\r\n" % tokens)
        # Not read yet: the reply stalls once the sockets are full, its last layers
        # unsent, while another client overwrites the last layer's rows.
        wait_until(lambda: _info(rb, "tier_streamed_fills") == 1, what="the streamed fetch")
        new = rows(tokens, dim, 1234).astype("<f2").tobytes()
        last = layers - 1
        assert (
            rb.execute_command("V.STOREBATCH", "w_pk", last, 0, tokens, new, "FMT", "F16") == b"OK"
        )
        assert _read_reply(reader) == want  # the tier's bytes, every layer
    finally:
        reader.close()
    assert rb.execute_command("V.FETCH", "w_pk", last, "RANGE", 0, tokens, "FMT", "NATIVE") == new
