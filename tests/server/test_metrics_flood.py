"""The metrics port under a connection flood (issue: each connection got a thread with
no read timeout; 389 half-requests made 386 threads, filled the descriptor table, and
RESP clients and scrapes were refused).

Real server process, real TCP: 1,000 connections that send half a request and wait.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import psutil

from support import running_server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_thousand_idle_metrics_connections_change_nothing(tmp_path: Path) -> None:
    port = _free_port()
    with running_server(tmp_path, "--no-wal", "--metrics-port", str(port)) as srv:
        proc = psutil.Process(srv.proc.pid)
        threads = proc.num_threads()
        idle = []
        try:
            for _ in range(1000):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
                idle.append(s)
            # No thread per connection, and the descriptors are not kept.
            assert proc.num_threads() <= threads + 2
            assert proc.num_fds() < 400
            with srv.client() as r:
                assert r.ping()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as resp:
                text = resp.read().decode()
            assert resp.status == 200
            assert "pion_connected_clients" in text
            assert "pion_client_io_errors_total" in text
        finally:
            for s in idle:
                s.close()
