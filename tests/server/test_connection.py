"""The connection protocol driven through a fake transport (no sockets): ordering,
back-pressure, QUIT and protocol errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pion.config import ProtocolLimits
from pion.server.connection import Connection
from support.transport import FakeTransport, connect


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
        t = FakeTransport(keep=True)
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
