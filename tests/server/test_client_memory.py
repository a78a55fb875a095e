"""``--maxmemory-clients`` bounds what clients make the server hold, as RSS, and an
evicted client is gone at once (issue: the accounting counted reply payload only, so
RSS grew to 5x the bound; an evicted client stayed registered for seconds).

Real server process, real TCP: clients that pipeline small commands and never read.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

from support import MiB, encode_command, running_server

BOUND = 32 * MiB


def _hog(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", port))
    return s


def _pipeline_without_reading(s: socket.socket, password: str) -> None:
    batch = encode_command("GET", "v") * 20_000  # 1 KiB replies for 20-byte commands
    try:
        s.sendall(encode_command("AUTH", password))
        while True:
            s.sendall(batch)
    except OSError:
        pass  # evicted, or shut down by the test


def test_non_reading_pipelines_stay_within_the_bound_and_evicted_clients_leave_at_once(
    tmp_path: Path,
) -> None:
    with running_server(
        tmp_path, "--no-wal", "--maxmemory-clients", str(BOUND), password="pw"
    ) as srv:
        r = srv.client()
        r.set("v", b"x" * 1024)
        base = srv.rss()
        socks = [_hog(srv.port) for _ in range(4)]
        hogs = [threading.Thread(target=_pipeline_without_reading, args=(s, "pw")) for s in socks]
        for t in hogs:
            t.start()
        peak = base
        evicted_and_gone = False
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline:
                peak = max(peak, srv.rss())
                info = r.info()
                if info["evicted_clients"] >= len(hogs):
                    # The same INFO: every evicted client is already unregistered.
                    assert info["connected_clients"] == 1, info["connected_clients"]
                    assert b"cmd=get" not in r.execute_command("CLIENT", "LIST")
                    evicted_and_gone = True
                    break
                time.sleep(0.02)
        finally:
            for s in socks:  # unblocks a send the server's back-pressure holds
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            for t in hogs:
                t.join(timeout=10)
        assert evicted_and_gone, "the hogs were not all evicted"
        # RSS grows by at most 1.5x the bound (the accounting counts what the server
        # holds, pieces and their overhead, not only reply payload).
        assert peak - base <= 1.5 * BOUND, (peak - base) / MiB
        assert "maxmemory-clients" in srv.log()
        assert r.ping()
