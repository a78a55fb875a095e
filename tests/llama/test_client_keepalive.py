"""The client's idle connections to llama-server end before llama-server ends them:
cpp-httplib closes a connection idle for 5 s and drops a request that arrives on it in
that instant, so a connection idle for longer than ``KEEPALIVE_S`` is not reused. A
small HTTP/1.1 server on a real socket counts the connections the client opens."""

from __future__ import annotations

import asyncio

from pion.llama.client import KEEPALIVE_S, AsyncLlamaClient

_OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
    b'{"status":"ok"}'
)


async def _serve(connections: list[int]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while await reader.readuntil(b"\r\n\r\n"):  # GET requests: no body
            writer.write(_OK)
            await writer.drain()

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(guarded, "127.0.0.1", 0)


def test_an_idle_connection_is_not_reused_past_the_keepalive() -> None:
    async def scenario() -> list[int]:
        counts: list[int] = []
        server = await _serve(counts)
        port = server.sockets[0].getsockname()[1]
        client = AsyncLlamaClient(f"http://127.0.0.1:{port}")
        try:
            await client.health()
            await client.health()  # at once: the same connection
            reused = len(counts)
            await asyncio.sleep(KEEPALIVE_S + 0.5)
            await client.health()  # idle past the keepalive: a new connection
            return [reused, len(counts)]
        finally:
            await client.aclose()
            server.close()
            await server.wait_closed()

    assert KEEPALIVE_S < 5.0  # cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND
    assert asyncio.run(scenario()) == [1, 2]
