"""One client cannot hold up the others (issue: a PING flood delayed another client's
PING by seconds; KEYS over 300k keys stalled everyone), and replies of any size arrive
whole (a reply of more than 2^20 pieces used to close the connection silently).

Against a real server process over TCP. No speed thresholds: the flood tests count
how many of the flood's commands ran while another client's one command waited (a
fair server runs a slice of them, an unfair one hundreds of thousands), and the long
command test compares the probe's wait with the long command's own duration.
"""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from support import ServerProcess, encode_command, running_server

_PONG = b"+PONG\r\n"


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path, "--no-wal", "--no-binary-lane") as s:
        yield s


def _ping(sock: socket.socket) -> None:
    sock.sendall(encode_command("PING"))
    got = b""
    while not got.endswith(b"\r\n"):
        chunk = sock.recv(64)
        assert chunk, "server closed the probe"
        got += chunk
    assert got == _PONG


class Flood:
    """A client sending inline PINGs in 1 MB writes as fast as it can, reading its
    replies; ``answered`` counts the PONGs it has received."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.answered = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._read, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        chunk = b"PING\r\n" * ((1 << 20) // 6)
        try:
            while not self._stop.is_set():
                self.sock.sendall(chunk)
        except OSError:
            pass

    def _read(self) -> None:
        got = 0
        try:
            while not self._stop.is_set():
                data = self.sock.recv(1 << 20)
                if not data:
                    return
                got += len(data)
                self.answered = got // len(_PONG)
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for t in self._threads:
            t.join(timeout=10)


def test_a_ping_flood_is_interleaved_with_another_clients_commands(srv: ServerProcess) -> None:
    flood = Flood(srv.port)
    try:
        deadline = time.monotonic() + 20
        while flood.answered < 100_000:  # the flood is being served
            assert time.monotonic() < deadline, "the flood got no replies"
            time.sleep(0.01)
        ran_meanwhile = []
        with srv.connect(timeout=30) as probe:
            for _ in range(7):
                before = flood.answered
                _ping(probe)
                ran_meanwhile.append(flood.answered - before)
                time.sleep(0.02)
        # Served in slices, the probe waits for a slice of the flood (a few thousand
        # PINGs at most); served a read at a time, for hundreds of thousands.
        assert statistics.median(ran_meanwhile) < 60_000, ran_meanwhile
        info = srv.info("stats")
        assert info["client_slices_yielded"] > 0
    finally:
        flood.close()


def test_an_unauthenticated_flood_does_not_hold_up_an_authenticated_client(
    tmp_path: Path,
) -> None:
    with running_server(tmp_path, "--no-wal", "--no-binary-lane", password="s3cret") as srv:
        flood = Flood(srv.port)  # answered -NOAUTH, 34 bytes a PING
        try:
            deadline = time.monotonic() + 20
            while flood.answered < 100_000:
                assert time.monotonic() < deadline, "the flood got no replies"
                time.sleep(0.01)
            with srv.client() as r:
                r.ping()
                waits = []
                for _ in range(7):
                    before = flood.answered
                    assert r.ping()
                    waits.append(flood.answered - before)
                    time.sleep(0.02)
            # -NOAUTH is ~5x a PONG: ``answered`` counts PONG-sized units.
            assert statistics.median(waits) < 5 * 60_000, waits
        finally:
            flood.close()


def _read_reply_of(sock: socket.socket, expect_end: bytes, count: int) -> tuple[bytes, float]:
    """Read until ``count`` occurrences of ``expect_end``-terminated items arrived;
    return the bytes and when the first byte came."""
    buf = bytearray()
    first = 0.0
    while buf.count(expect_end) < count:
        chunk = sock.recv(1 << 20)
        assert chunk, "server closed the connection"
        if not buf:
            first = time.monotonic()
        buf += chunk
    return bytes(buf), first


def test_keys_over_a_large_keyspace_lets_other_clients_in(srv: ServerProcess) -> None:
    n = 150_000
    with srv.client() as r:
        pipe = r.pipeline(transaction=False)
        for start in range(0, n, 10_000):
            pipe.mset({f"k{i:07d}": "v" for i in range(start, start + 10_000)})
        pipe.execute()
        assert r.dbsize() == n
    done = threading.Event()
    waits: list[float] = []

    def probe() -> None:
        with srv.connect(timeout=30) as p:
            while not done.is_set():
                t0 = time.monotonic()
                _ping(p)
                waits.append(time.monotonic() - t0)

    with srv.connect(timeout=60) as keys:
        t = threading.Thread(target=probe, daemon=True)
        t.start()
        time.sleep(0.1)
        start = time.monotonic()
        keys.sendall(encode_command("KEYS", "*"))
        data, _ = _read_reply_of(keys, b"\r\n", 2 * n + 1)
        took = time.monotonic() - start
        done.set()
        t.join(timeout=30)
    assert data.startswith(b"*%d\r\n" % n)
    assert data.count(b"$8\r\nk") == n
    # The long command was cut into steps: no probe PING waited for the whole of it.
    assert waits
    assert max(waits) < took / 2, (max(waits), took)


class Probe:
    """A client PINGing one at a time on its own connection; ``waits`` holds each
    round trip (s)."""

    def __init__(self, srv: ServerProcess) -> None:
        self.waits: list[float] = []
        self._srv = srv
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._srv.connect(timeout=30) as p:
            while not self._done.is_set():
                t0 = time.monotonic()
                _ping(p)
                self.waits.append(time.monotonic() - t0)

    def stop(self) -> list[float]:
        self._done.set()
        self._thread.join(timeout=30)
        assert self.waits
        return self.waits


def test_a_large_exec_lets_other_clients_in(srv: ServerProcess) -> None:
    """MULTI, KEYS over a large keyspace, EXEC: the transaction's commands run at once
    (nobody sees it half-applied) and its reply is encoded in steps, so no probe PING
    waits for the whole of it."""
    n = 150_000
    with srv.client() as r:
        pipe = r.pipeline(transaction=False)
        for start in range(0, n, 10_000):
            pipe.mset({f"k{i:07d}": "v" for i in range(start, start + 10_000)})
        pipe.execute()
    with srv.connect(timeout=60) as tx:
        probe = Probe(srv)
        time.sleep(0.1)
        start = time.monotonic()
        tx.sendall(
            encode_command("MULTI")
            + encode_command("SET", "a", "1")
            + encode_command("KEYS", "*")
            + encode_command("EXEC")
        )
        data, _ = _read_reply_of(tx, b"\r\n", 2 * (n + 1) + 5)
        took = time.monotonic() - start
        waits = probe.stop()
    assert data.startswith(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n*%d\r\n" % (n + 1))
    assert data.count(b"$8\r\nk") == n
    assert max(waits) < took / 2, (max(waits), took)


def test_a_silenced_bulk_load_of_quantized_layers_keeps_the_slices(srv: ServerProcess) -> None:
    """CLIENT REPLY OFF, then large V.STOREBATCHes: their quantization runs on the
    worker pool as any client's does (it used to run inline, on the loop), so the
    probe's PINGs go on meanwhile; the rows are all stored."""
    dim, count, layers = 1024, 8192, 6  # 32 MiB of fp32 rows per layer
    rng = np.random.default_rng(1)
    blob = rng.standard_normal((count, dim)).astype("<f4").tobytes()
    with srv.client() as r:
        r.execute_command("V.CREATE", "s", dim, "VQUANT", "int8")
        before = srv.info("stats")["offloaded_commands"]
    with srv.connect(timeout=60) as load:
        probe = Probe(srv)
        time.sleep(0.1)
        start = time.monotonic()
        load.sendall(encode_command("CLIENT", "REPLY", "OFF"))
        for layer in range(layers):
            load.sendall(encode_command("V.STOREBATCH", "s", layer, 0, count, blob))
        load.sendall(encode_command("CLIENT", "REPLY", "ON") + encode_command("PING"))
        got, _ = _read_reply_of(load, b"\r\n", 2)
        took = time.monotonic() - start
        waits = probe.stop()
    assert got == b"+OK\r\n+PONG\r\n"
    assert srv.info("stats")["offloaded_commands"] - before == layers
    with srv.client() as r:
        assert r.execute_command("V.INFO", "s")  # the session holds its layers
    assert max(waits) < took / 2, (max(waits), took)


def test_a_reply_of_more_than_2_20_pieces_arrives_whole(srv: ServerProcess) -> None:
    n = 200_000  # HGETALL: 400,000 bulks, 1.2 million pieces
    with srv.client() as r:
        fields = {f"f{i:06d}": f"v{i}" for i in range(n)}
        r.hset("h", mapping=fields)
        got = r.hgetall("h")
        assert len(got) == n
        assert got[b"f123456"] == b"v123456"
        assert srv.info("stats")["client_io_errors"] == 0


def test_a_connection_lost_to_a_socket_error_is_logged_and_counted(srv: ServerProcess) -> None:
    # A client asks for a large reply and resets the connection (RST) without reading.
    with srv.client() as r:
        r.hset("big", mapping={f"f{i}": "x" * 100 for i in range(20_000)})
    s = srv.connect()
    s.sendall(encode_command("HGETALL", "big") * 50)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    deadline = time.monotonic() + 20
    while srv.info("stats")["client_io_errors"] < 1:
        assert time.monotonic() < deadline, "the reset was not counted"
        time.sleep(0.05)
    assert "the connection failed" in srv.log() or "writing a reply failed" in srv.log()
