"""The connection protocol driven through a fake transport (no sockets): ordering,
back-pressure, QUIT and protocol errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pion.config import ServerConfig
from pion.server.app import PionServer
from pion.server.connection import Connection
from pion.server.run import build_state


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def writelines(self, chunks: list[Any]) -> None:
        for c in chunks:
            self.written += bytes(c)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str) -> Any:
        return None

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def connect(tmp_path: Path) -> tuple[Connection, FakeTransport]:
    state = build_state(ServerConfig(port=0, wal_enabled=False, dir=tmp_path))
    # Pure protocol tests: no data directory behind this state.
    assert state.persistence is not None
    state.persistence.close()
    state.persistence = None
    state.loading = False
    server = PionServer(state)
    conn = Connection(
        state, server.table, server.sink, 1, server.connections, memory=server.client_memory
    )
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def run(coro_fn: Any) -> None:
    asyncio.run(coro_fn())


def test_replies_in_order_across_split_reads(tmp_path: Path) -> None:
    async def body() -> None:
        conn, t = connect(tmp_path)
        wire = b"".join(b"*2\r\n$4\r\nECHO\r\n$1\r\n%d\r\n" % i for i in range(10))
        for i in range(0, len(wire), 7):
            conn.data_received(wire[i : i + 7])
        assert bytes(t.written) == b"".join(b"$1\r\n%d\r\n" % i for i in range(10))

    run(body)


def test_back_pressure_holds_commands_until_resumed(tmp_path: Path) -> None:
    async def body() -> None:
        conn, t = connect(tmp_path)
        conn.pause_writing()
        assert not t.reading
        conn.data_received(b"PING\r\nECHO a\r\n")
        assert t.written == b""  # nothing processed while the peer is not reading
        conn.resume_writing()
        assert t.reading
        assert bytes(t.written) == b"+PONG\r\n$1\r\na\r\n"

    run(body)


def test_quit_replies_then_closes_and_ignores_the_rest(tmp_path: Path) -> None:
    async def body() -> None:
        conn, t = connect(tmp_path)
        conn.data_received(b"QUIT\r\nPING\r\n")
        assert bytes(t.written) == b"+OK\r\n"
        assert t.closed

    run(body)


def test_protocol_error_answers_then_closes(tmp_path: Path) -> None:
    async def body() -> None:
        conn, t = connect(tmp_path)
        conn.data_received(b"PING\r\n*1\r\n$-3\r\n")
        assert bytes(t.written) == b"+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"
        assert t.closed

    run(body)


def test_connection_lost_unregisters_the_client(tmp_path: Path) -> None:
    async def body() -> None:
        conn, _ = connect(tmp_path)
        state = conn._state
        assert conn.client.id in state.clients
        conn.connection_lost(None)
        assert conn.client.id not in state.clients

    run(body)
