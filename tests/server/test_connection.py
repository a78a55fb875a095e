"""The connection protocol driven through a fake transport (no sockets): ordering,
back-pressure, QUIT and protocol errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pion.config import ProtocolLimits, ServerConfig
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

    def write(self, data: bytes) -> None:
        self.written += data

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


class PeerNotReading(FakeTransport):
    """A transport whose peer reads nothing: every byte written stays buffered, and
    like asyncio's transports it calls pause_writing() once over its high mark."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: Connection | None = None
        self.high = 0
        self.buffered = 0
        self.paused = False

    def set_write_buffer_limits(self, high: int) -> None:
        self.high = high

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def writelines(self, chunks: list[Any]) -> None:
        super().writelines(chunks)
        self.buffered += sum(len(bytes(c)) for c in chunks)
        if self.buffered > self.high and not self.paused and self.protocol is not None:
            self.paused = True
            self.protocol.pause_writing()

    def drain(self) -> None:
        """The peer read everything."""
        self.buffered = 0
        if self.paused and self.protocol is not None:
            self.paused = False
            self.protocol.resume_writing()


def connect(
    tmp_path: Path, transport: FakeTransport | None = None, **config: Any
) -> tuple[Connection, FakeTransport]:
    state = build_state(ServerConfig(port=0, wal_enabled=False, dir=tmp_path, **config))
    # Pure protocol tests: no data directory behind this state.
    assert state.persistence is not None
    state.persistence.close()
    state.persistence = None
    state.loading = False
    server = PionServer(state)
    conn = Connection(
        state, server.table, server.sink, 1, server.connections, memory=server.client_memory
    )
    transport = transport or FakeTransport()
    if isinstance(transport, PeerNotReading):
        transport.protocol = conn
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


def _echo(i: int, size: int = 500) -> bytes:
    payload = b"%05d" % i + b"x" * (size - 5)
    return b"*2\r\n$4\r\nECHO\r\n$%d\r\n%s\r\n" % (len(payload), payload)


def test_commands_stop_at_the_high_water_mark_checked_per_command(tmp_path: Path) -> None:
    """One read holding 100 commands whose replies (~507 bytes each) the peer never
    reads: with a 2000-byte mark only a handful run, not all 100."""

    async def body() -> None:
        t = PeerNotReading()
        conn, _ = connect(tmp_path, t, protocol=ProtocolLimits(reply_high_water=2000))
        state = conn._state
        conn.data_received(b"".join(_echo(i) for i in range(100)))
        ran = state.counters.total_commands_processed
        assert 1 <= ran <= 5
        assert not t.reading  # and the socket is not read meanwhile
        # The peer reads; the rest runs, mark by mark, in order.
        while state.counters.total_commands_processed < 100:
            before = state.counters.total_commands_processed
            t.drain()
            await asyncio.sleep(0)
            assert state.counters.total_commands_processed > before
        t.drain()
        assert t.reading
        replies = bytes(t.written).split(b"\r\n")[1::2]
        assert [r[:5] for r in replies] == [b"%05d" % i for i in range(100)]

    run(body)


def test_no_command_runs_once_the_socket_is_closing(tmp_path: Path) -> None:
    """The peer went away (a write failed, the transport is closing): whatever it had
    pipelined builds no replies."""

    class FailsOnWrite(FakeTransport):
        def writelines(self, chunks: list[Any]) -> None:
            self.closed = True  # as a transport does when send() fails: EPIPE

    async def body() -> None:
        conn, _ = connect(tmp_path, FailsOnWrite())
        state = conn._state
        conn.data_received(b"".join(_echo(i, 70_000) for i in range(20)))
        assert state.counters.total_commands_processed == 1

    run(body)


def test_small_replies_are_gathered_into_few_writes(tmp_path: Path) -> None:
    class Counting(FakeTransport):
        calls = 0

        def writelines(self, chunks: list[Any]) -> None:
            Counting.calls += 1
            super().writelines(chunks)

    async def body() -> None:
        conn, t = connect(tmp_path, Counting())
        conn.data_received(b"PING\r\n" * 10_000)
        assert bytes(t.written) == b"+PONG\r\n" * 10_000
        assert Counting.calls <= 3

    run(body)


def test_past_maxclients_the_connection_is_refused(tmp_path: Path) -> None:
    async def body() -> None:
        conn, _ = connect(tmp_path, maxclients=1)
        state = conn._state
        server_connections = conn._registry
        extra = Connection(
            state, conn._ctx.table, conn._sink, 2, server_connections, memory=conn._memory
        )
        t2 = FakeTransport()
        extra.connection_made(t2)  # type: ignore[arg-type]
        assert bytes(t2.written) == b"-ERR max number of clients reached\r\n"
        assert t2.closed
        assert 2 not in state.clients
        assert state.counters.rejected_connections == 1
        extra.connection_lost(None)
        assert 1 in state.clients  # the refused one's loss touches nobody else

    run(body)
