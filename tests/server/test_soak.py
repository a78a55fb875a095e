"""Soak: hostile and normal clients at once against one real server process, for a
bounded time (about 20 s), in the default suite.

Hostile: oversized unauthenticated headers, unauthenticated argument floods, garbage
bytes, half-sent bulks (before and after AUTH), idle unauthenticated connections, and
authenticated pipelines of 8 MiB fetches that never read. Normal: three redis-py
clients that register namespaces, store rows, fetch them back and look them up.

Checked: every normal result is exact; every normal reply comes within a loose bound
(10 s; tests never assert speed); the server's RSS, sampled throughout, stays under a
bound far below what the hostile clients could make today's code hold; the server is
alive and serving at the end.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import redis

from support import MiB, ServerProcess, encode_command, running_server, store_fetchable

PASSWORD = "soak-pass"
SOAK_SECONDS = 20.0
REPLY_BOUND_S = 10.0
# Four non-reading fetchers can hold a high-water mark (64 MiB) plus a reply each; the
# maxmemory-clients bound (256 MiB) disconnects the largest beyond that. Everything
# else is small. Without the limits, one fetcher alone holds 40 replies (320 MiB) and
# each oversized AUTH header up to 512 MiB.
RSS_BOUND = 600 * MiB
ROWS, DIM = 256, 8192
FETCH = encode_command("V.FETCH", "big", 0, "RANGE", 0, ROWS)


class Soak:
    def __init__(self, srv: ServerProcess) -> None:
        self.srv = srv
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.normal_ops = 0
        self.worst_reply_s = 0.0
        self.lock = threading.Lock()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.srv.port), timeout=REPLY_BOUND_S)

    def hostile(self, name: str, attempt: Callable[[random.Random], None], seed: int) -> None:
        """Run ``attempt`` until the end; the server may hang up on it at any point,
        but it must never leave it waiting past the bound."""
        rng = random.Random(seed)
        while not self.stop.is_set():
            try:
                attempt(rng)
            except (ConnectionResetError, BrokenPipeError):
                pass
            except TimeoutError:
                self.errors.append(f"{name}: no answer within {REPLY_BOUND_S} s")
            except Exception as exc:  # collected for the assertion
                self.errors.append(f"{name}: {exc!r}")

    def timed(self, r: redis.Redis, *args: object) -> object:
        """One command on ``r``, its reply time recorded."""
        t0 = time.monotonic()
        result = r.execute_command(*args)
        took = time.monotonic() - t0
        with self.lock:
            self.worst_reply_s = max(self.worst_reply_s, took)
        return result


def _expect_refusal(sock: socket.socket, text: bytes) -> None:
    got = b""
    while b"\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    if not got.startswith(b"-ERR Protocol error: " + text):
        raise AssertionError(f"expected a refusal ({text!r}), got {got[:80]!r}")


def _oversized_auth(soak: Soak) -> Callable[[random.Random], None]:
    def attempt(rng: random.Random) -> None:
        with soak.connect() as s:
            s.sendall(b"*2\r\n$4\r\nAUTH\r\n$536870912\r\n")
            with contextlib.suppress(OSError):  # refused and closed mid-send
                s.sendall(b"x" * MiB)
            _expect_refusal(s, b"unauthenticated bulk length")

    return attempt


def _argument_flood(soak: Soak) -> Callable[[random.Random], None]:
    def attempt(rng: random.Random) -> None:
        with soak.connect() as s:
            # More than 10 but within the authenticated limit (1M): the unauthenticated text.
            s.sendall(b"*%d\r\n" % rng.randint(11, 1024 * 1024))
            _expect_refusal(s, b"unauthenticated multibulk length")

    return attempt


def _garbage(soak: Soak) -> Callable[[random.Random], None]:
    def attempt(rng: random.Random) -> None:
        with soak.connect() as s:
            s.sendall(rng.randbytes(rng.randint(1, 70_000)))
            s.settimeout(0.5)
            try:
                while s.recv(65536):
                    pass
            except TimeoutError:
                pass  # garbage that parsed as inline commands: the connection lives

    return attempt


def _half_sent(soak: Soak) -> Callable[[random.Random], None]:
    def attempt(rng: random.Random) -> None:
        with soak.connect() as s:
            if rng.random() < 0.5:
                s.sendall(encode_command("AUTH", PASSWORD))
                s.recv(100)
                s.sendall(b"*3\r\n$12\r\nV.STOREBATCH\r\n$100000\r\n" + b"y" * 5000)
            else:
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$16000\r\n" + b"z" * 100)
        time.sleep(0.01)

    return attempt


def _fetch_hog(soak: Soak) -> Callable[[random.Random], None]:
    def attempt(rng: random.Random) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        with s:
            s.settimeout(REPLY_BOUND_S)
            s.connect(("127.0.0.1", soak.srv.port))
            s.sendall(encode_command("AUTH", PASSWORD) + FETCH * 40)
            soak.stop.wait(rng.uniform(1.0, 3.0))  # never reads

    return attempt


def _idle_unauthenticated(soak: Soak, held: list[socket.socket]) -> None:
    for _ in range(50):
        s = soak.connect()
        s.sendall(b"*1\r\n$4\r\nPI")  # and nothing more
        held.append(s)


def _normal(soak: Soak, index: int) -> None:
    rng = np.random.default_rng(index)
    r = soak.srv.client(socket_timeout=REPLY_BOUND_S)
    dim = 128
    try:
        iteration = 0
        while not soak.stop.is_set():
            ns = f"normal{index}-{iteration % 4}"
            soak.timed(r, "KV.PREFIX.REGISTER", ns, dim, "fp16")
            rows = rng.standard_normal((64, dim)).astype(np.float16).astype("<f4")
            for half in ("_pk", "_pv"):
                sid = ns + half
                ok = soak.timed(r, "V.STOREBATCH", sid, 0, 0, 64, rows.tobytes())
                if ok != b"OK":
                    raise AssertionError(f"V.STOREBATCH {sid}: {ok!r}")
                back = soak.timed(r, "V.FETCH", sid, 0, "RANGE", 0, 64)
                assert isinstance(back, bytes)
                if not np.array_equal(np.frombuffer(back, "<f4").reshape(64, dim), rows):
                    raise AssertionError(f"V.FETCH {sid}: rows differ")
            hit = soak.timed(r, "KV.PREFIX.LOOKUP", ns)
            if hit != b"HIT":
                raise AssertionError(f"LOOKUP {ns}: {hit!r}")
            with soak.lock:
                soak.normal_ops += 1
            iteration += 1
    except Exception as exc:  # collected for the assertion
        soak.errors.append(f"normal client {index}: {exc!r}")
    finally:
        r.close()


def test_soak_hostile_and_normal_clients(tmp_path: Path) -> None:
    args = ("--maxmemory-clients", "256mb", "--appendfsync", "everysec")
    with running_server(tmp_path, *args, password=PASSWORD) as srv:
        with srv.client() as setup:
            store_fetchable(setup, "big", ROWS, DIM)
        soak = Soak(srv)
        base = srv.rss()
        peak = base
        idle: list[socket.socket] = []
        _idle_unauthenticated(soak, idle)
        hostile = [
            ("oversized AUTH", _oversized_auth(soak)),
            ("argument flood", _argument_flood(soak)),
            ("garbage", _garbage(soak)),
            ("half-sent bulk", _half_sent(soak)),
        ] + [(f"fetch hog {i}", _fetch_hog(soak)) for i in range(4)]
        threads = [
            threading.Thread(target=soak.hostile, args=(name, fn, seed), daemon=True)
            for seed, (name, fn) in enumerate(hostile)
        ]
        threads += [threading.Thread(target=_normal, args=(soak, i), daemon=True) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + SOAK_SECONDS
        try:
            while time.monotonic() < deadline and srv.alive():
                peak = max(peak, srv.rss())
                time.sleep(0.1)
        finally:
            soak.stop.set()
            for t in threads:
                t.join(timeout=30)
            for s in idle:
                s.close()
        assert srv.alive(), srv.log()[-2000:]
        assert not soak.errors, soak.errors[:10]
        assert not any(t.is_alive() for t in threads)
        assert soak.normal_ops >= 3  # the normal clients got through, not starved
        assert soak.worst_reply_s < REPLY_BOUND_S
        assert peak - base < RSS_BOUND, f"server grew {(peak - base) / MiB:.0f} MiB"
        with srv.client() as r:
            assert r.ping()
            stats = r.info("stats")
            assert stats["total_protocol_errors"] > 0
            assert stats["total_internal_errors"] == 0
