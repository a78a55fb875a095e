"""Reply memory is bounded per connection, and all client buffers together, judged by
the server process's own resident set size.

The issue's reproductions: 200 pipelined 8 MiB fetches from a client that does not read
took the server to 1.6 GiB (every reply was built before any was sent); a reading client
peaked at 846 MiB; a client that hung up still had all its replies built. Bounds are
generous (allocator slack, numpy temporaries, the kernel's socket buffers) but far
below those numbers.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from support import (
    MiB,
    ServerProcess,
    encode_command,
    running_server,
    store_fetchable,
    wait_until,
)

# One fetch reply: 256 rows of 8192 fp32 values = 8 MiB.
ROWS, DIM = 256, 8192
REPLY = ROWS * DIM * 4
FETCH = encode_command("V.FETCH", "big", 0, "RANGE", 0, ROWS)


def _non_reader(srv: ServerProcess) -> socket.socket:
    """A socket that will not read: a small receive buffer, so the kernel cannot hide
    much of what the server sends."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", srv.port))
    return s


def _peak_rss_while(srv: ServerProcess, seconds: float, check: Callable[[], None]) -> int:
    """Sample the server's RSS for ``seconds``, running ``check`` between samples."""
    peak = srv.rss()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, srv.rss())
        check()
        time.sleep(0.05)
    return peak


def _fetches(srv: ServerProcess) -> int:
    return int(srv.info("stats")["vstore_total_fetches"])


def test_non_reading_pipeline_of_big_fetches(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal") as srv, srv.client() as r:
        values = store_fetchable(r, "big", ROWS, DIM)
        base = srv.rss()
        hog = _non_reader(srv)
        hog.sendall(FETCH * 200)

        def others_are_served() -> None:
            assert r.ping()

        peak = _peak_rss_while(srv, 3.0, others_are_served)
        assert peak - base < 250 * MiB, f"server grew {(peak - base) / MiB:.0f} MiB"
        # The hog's commands wait: a high-water mark of replies, not 200 of them.
        assert _fetches(srv) < 40
        # Another client's fetch is whole and right meanwhile.
        back = r.execute_command("V.FETCH", "big", 0, "RANGE", 0, ROWS)
        assert np.array_equal(np.frombuffer(back, "<f4").reshape(ROWS, DIM), values)
        hog.close()


def test_reading_client_peak_is_bounded(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal") as srv, srv.client() as r:
        values = store_fetchable(r, "big", ROWS, DIM)
        base = srv.rss()
        peak = [base]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], srv.rss())
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            pipe = r.pipeline(transaction=False)
            for _ in range(200):
                pipe.execute_command("V.FETCH", "big", 0, "RANGE", 0, ROWS)
            replies = pipe.execute()
        finally:
            stop.set()
            sampler.join()
        assert len(replies) == 200
        expected = values.tobytes()
        assert all(reply == expected for reply in replies)
        assert peak[0] - base < 300 * MiB, f"server peaked {(peak[0] - base) / MiB:.0f} MiB"


def test_no_replies_are_built_for_a_client_that_hung_up(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal") as srv, srv.client() as r:
        store_fetchable(r, "big", ROWS, DIM)
        before = _fetches(srv)
        accepted = r.info("stats")["total_connections_received"]
        gone = _non_reader(srv)
        gone.sendall(FETCH * 200)
        gone.close()
        wait_until(
            lambda: r.info("stats")["total_connections_received"] > accepted,
            what="the server accepted the connection",
        )
        # Gone once the server next writes to it (a fetch in progress finishes first);
        # from then on no fetch of its can run, so the count below is final.
        wait_until(
            lambda: r.info("clients")["connected_clients"] == 1,  # only r
            what="the hung-up client dropped",
        )
        assert _fetches(srv) - before < 40


def _read_exactly(sock: socket.socket, want: bytes) -> None:
    """Read len(want) bytes and compare them as they come (no 1 GiB buffer here)."""
    view = memoryview(want)
    pos = 0
    while pos < len(want):
        chunk = sock.recv(min(4 * MiB, len(want) - pos))
        assert chunk, f"closed after {pos} of {len(want)} bytes"
        assert chunk == view[pos : pos + len(chunk)], f"reply differs at byte {pos}"
        pos += len(chunk)


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_backlogged_pipeline_with_writes_completes_in_order(tmp_path: Path, fsync: str) -> None:
    """Writes between the fetches: under ``always`` every reply after a write waits
    for the group commit, held by the server, not by the socket. Those count against
    the mark too; once the client reads, every reply arrives, in order."""
    with running_server(tmp_path, "--appendfsync", fsync) as srv, srv.client() as r:
        values = store_fetchable(r, "big", ROWS, DIM)
        r.execute_command("V.CREATE", "small", 4, "VQUANT", "fp16")
        row = np.arange(4, dtype="<f4").tobytes()
        store = encode_command("V.STOREBATCH", "small", 0, 0, 1, row)
        base = srv.rss()
        n = 60
        sock = _non_reader(srv)
        sock.sendall((store + FETCH) * n)
        peak = _peak_rss_while(srv, 2.0, lambda: None)
        assert peak - base < 250 * MiB, f"server grew {(peak - base) / MiB:.0f} MiB"
        assert _fetches(srv) < 40
        fetch_reply = b"$%d\r\n" % REPLY + values.tobytes() + b"\r\n"
        sock.settimeout(60)
        for _ in range(n):
            _read_exactly(sock, b"+OK\r\n")
            _read_exactly(sock, fetch_reply)
        sock.close()
