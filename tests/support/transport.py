"""A fake asyncio transport and a :class:`~pion.server.connection.Connection` on it: the
connection protocol driven without sockets (``from support.transport import ...``).

:class:`FakeTransport` gathers what the connection writes. By default its peer reads
everything at once; with ``keep`` it reads nothing until :meth:`FakeTransport.drain`,
and like asyncio's transports it calls the protocol's ``pause_writing()`` once its
unsent bytes pass ``high`` (and ``resume_writing()`` when drained).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pion.config import ServerConfig
from pion.server.app import PionServer
from pion.server.connection import Connection
from pion.server.run import build_state

__all__ = ["FakeTransport", "connect"]


class FakeTransport:
    def __init__(self, *, keep: bool = False, high: int = 1 << 40) -> None:
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True
        self.keep = keep  # hold written bytes as unsent (a peer that does not read)
        self.buffered = 0  # bytes "in the socket", until drain()
        self.high = high
        self.paused = False
        self.protocol: Connection | None = None

    def writelines(self, chunks: list[Any]) -> None:
        for c in chunks:
            data = bytes(c)
            self.written += data
            if self.keep:
                self.buffered += len(data)
        if self.keep and self.buffered > self.high and not self.paused:
            self.paused = True
            if self.protocol is not None:
                self.protocol.pause_writing()

    def write(self, data: bytes) -> None:
        self.writelines([data])

    def drain(self) -> None:
        """The peer read everything."""
        self.buffered = 0
        if self.paused and self.protocol is not None:
            self.paused = False
            self.protocol.resume_writing()

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str) -> Any:
        return None

    def set_write_buffer_limits(self, high: int) -> None:
        if self.keep:
            self.high = high

    def get_write_buffer_size(self) -> int:
        return self.buffered


def connect(
    tmp_path: Path,
    transport: FakeTransport | None = None,
    *,
    offload: Any = None,
    table: Any = None,
    **config: Any,
) -> tuple[Connection, FakeTransport]:
    """A connection of a server built from ``ServerConfig(**config)`` (no data directory,
    no log), made on ``transport``. ``offload``: the worker pool for deferred commands
    (None: they run inline); ``table``: a command table of the test's own."""
    state = build_state(ServerConfig(port=0, wal_enabled=False, dir=tmp_path, **config))
    # Pure protocol tests: no data directory behind this state.
    assert state.persistence is not None
    state.persistence.close()
    state.persistence = None
    state.loading = False
    server = PionServer(state) if table is None else PionServer(state, table)
    server.offload.close()
    conn = Connection(
        state,
        server.table,
        server.sink,
        1,
        server.connections,
        memory=server.client_memory,
        offload=offload,
    )
    transport = transport or FakeTransport()
    transport.protocol = conn
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport
