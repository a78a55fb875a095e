"""Binary-lane connections are clients like RESP ones (issue: 450 unauthenticated lane
connections filled the descriptor table and a RESP client got RST; 4 lane connections
sending PING frames without reading took RSS from 48 to 358 MB, none evicted).

Real server process, real TCP, the lane on the RESP port + 1.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import redis

from pion.server.binary_wire import HEADER, MAGIC, OP_PING, STATUS_ERROR, STATUS_OK
from support import MiB, running_server


def _lane(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port + 1), timeout=10)


def _frame(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    magic, status, size = HEADER.unpack(head)
    assert magic == MAGIC
    body = b""
    while len(body) < size:
        body += sock.recv(size - len(body))
    return status, body


def test_lane_connections_count_against_maxclients_and_are_listed(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal", "--maxclients", "8", password="pw") as srv:
        r = srv.client()
        r.ping()
        lanes = [_lane(srv.port) for _ in range(7)]
        try:
            for s in lanes:  # each one served: the lane answers its liveness PING
                s.sendall(HEADER.pack(MAGIC, OP_PING, 0))
                assert _frame(s) == (STATUS_OK, b"")
            info = r.info("clients")
            assert info["connected_clients"] == 8
            listed = r.execute_command("CLIENT", "LIST").decode()
            assert listed.count(f":{srv.port + 1} ") == 7  # laddr: the lane's port
            # Full: a ninth client of either lane is refused with Redis's error.
            extra = _lane(srv.port)
            assert _frame(extra) == (STATUS_ERROR, b"ERR max number of clients reached")
            extra.close()
            with srv.connect() as resp:
                assert resp.recv(100) == b"-ERR max number of clients reached\r\n"
            assert r.info("stats")["rejected_connections"] == 2
        finally:
            for s in lanes:
                s.close()
        deadline = time.monotonic() + 10
        while r.info("clients")["connected_clients"] != 1:
            assert time.monotonic() < deadline, "lane clients never left"
            time.sleep(0.02)
        with srv.client() as again:
            assert again.ping()


def _ping_frames_without_reading(s: socket.socket) -> None:
    batch = HEADER.pack(MAGIC, OP_PING, 0) * 100_000
    try:
        while True:
            s.sendall(batch)
    except OSError:
        pass  # evicted, or shut down by the test


def test_lane_clients_are_held_to_maxmemory_clients(tmp_path: Path) -> None:
    bound = 8 * MiB
    with running_server(tmp_path, "--no-wal", "--maxmemory-clients", str(bound)) as srv:
        r = srv.client()
        base = srv.rss()
        socks = []
        for _ in range(4):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            s.connect(("127.0.0.1", srv.port + 1))
            socks.append(s)
        floods = [threading.Thread(target=_ping_frames_without_reading, args=(s,)) for s in socks]
        for t in floods:
            t.start()
        peak = base
        counted = seen = 0
        deadline = time.monotonic() + 4
        try:
            while time.monotonic() < deadline:
                peak = max(peak, srv.rss())
                info = r.info()
                counted = max(counted, info["mem_clients_normal"])
                seen = max(seen, info["connected_clients"] + info["evicted_clients"])
                time.sleep(0.02)
        finally:
            for s in socks:  # unblocks a send the server's back-pressure holds
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            for t in floods:
                t.join(timeout=10)
        # The lane's connections are clients whose buffers are counted (or evicted),
        # and RSS stays within 1.5x the bound.
        assert seen == 5, seen
        assert counted > 64 * 1024
        assert peak - base <= 1.5 * bound + 8 * MiB, (peak - base) / MiB
        assert r.ping()


def test_lane_auth_is_the_resp_auth(tmp_path: Path) -> None:
    with running_server(tmp_path, "--no-wal", password="pw") as srv:
        s = _lane(srv.port)
        s.sendall(HEADER.pack(MAGIC, 0x37, 5) + b"wrong")
        status, body = _frame(s)
        assert status == STATUS_ERROR
        assert body == b"WRONGPASS invalid username-password pair or user is disabled."
        s.sendall(HEADER.pack(MAGIC, 0x37, 2) + b"pw")
        assert _frame(s) == (STATUS_OK, b"")
        with srv.client() as r:
            listed = r.execute_command("CLIENT", "LIST").decode()
        assert "cmd=auth" in listed
        s.close()
        # The same password check, client for client: redis-py too.
        try:
            redis.Redis(port=srv.port, password="wrong").ping()
            raise AssertionError("a wrong password was accepted")
        except redis.AuthenticationError:
            pass
