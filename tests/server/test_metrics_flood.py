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


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):  # the server closes after its response
            out += chunk
    return out


def test_requests_the_endpoint_refuses_and_a_head_request(tmp_path: Path) -> None:
    port = _free_port()
    with running_server(tmp_path, "--no-wal", "--metrics-port", str(port)):
        get = _exchange(port, b"GET /metrics HTTP/1.0\r\n\r\n")
        head, _, body = get.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert length == len(body) and b"pion_connected_clients" in body
        # HEAD: the same head, no body.
        only = _exchange(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert only.startswith(b"HTTP/1.1 200 OK\r\n") and only.endswith(b"\r\n\r\n")
        assert b"Content-Length: " in only
        refused = {
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n": b"405",
            b"NOT HTTP AT ALL\r\n\r\n": b"400",
            # A head longer than MAX_REQUEST_BYTES and still not complete.
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"y" * 9000: b"431",
        }
        for request, status in refused.items():
            reply = _exchange(port, request)
            assert reply.startswith(b"HTTP/1.1 " + status + b" "), reply[:80]
            assert reply.endswith(b"Content-Length: 0\r\nConnection: close\r\n\r\n")
