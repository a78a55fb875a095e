"""Helpers for the keyspace tests (``from support.keyspace import ...``): a raw RESP
client that returns every reply's exact bytes (the oracle test compares them), a real
redis-server on a free port, and small wire utilities."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from pion.config import ServerConfig
from pion.server.run import ServerThread

Arg = bytes | str | int


def encode_command(args: Sequence[Arg]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        raw = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


@dataclass
class Reply:
    raw: bytes  # the exact bytes on the wire
    value: Any  # parsed: bytes, int, float text, list, dict, None, or Err


@dataclass(frozen=True)
class Err:
    line: bytes


def _line(f: BinaryIO) -> bytes:
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError(f"connection closed mid-reply ({line!r})")
    return line


def read_reply(f: BinaryIO) -> Reply:
    """One complete RESP2/RESP3 reply: its bytes and a parsed value."""
    line = _line(f)
    kind, body = line[:1], line[1:-2]
    raw = [line]
    value: Any
    if kind in (b"+", b"(", b","):
        value = body
    elif kind == b"-":
        value = Err(body)
    elif kind == b":":
        value = int(body)
    elif kind == b"#":
        value = body == b"t"
    elif kind == b"_":
        value = None
    elif kind in (b"$", b"=", b"!"):
        n = int(body)
        if n < 0:
            value = None
        else:
            data = f.read(n + 2)
            raw.append(data)
            value = data[:-2]
            if kind == b"!":
                value = Err(value)
    elif kind in (b"*", b"~", b">", b"%", b"|"):
        n = int(body)
        if n < 0:
            value = None
        else:
            count = 2 * n if kind in (b"%", b"|") else n
            items = [read_reply(f) for _ in range(count)]
            raw.extend(i.raw for i in items)
            vals = [i.value for i in items]
            value = dict(zip(vals[::2], vals[1::2], strict=True)) if kind == b"%" else vals
            if kind == b"%":
                value = ("map", sorted(value.items(), key=repr))
    else:
        raise ValueError(f"unknown RESP type in {line!r}")
    return Reply(b"".join(raw), value)


class RawClient:
    """One connection speaking RESP by hand; replies come back as exact bytes."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 60) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.sock.makefile("rb", buffering=1 << 20)

    def send(self, *args: Arg) -> None:
        self.sock.sendall(encode_command(args))

    def call(self, *args: Arg) -> Reply:
        self.send(*args)
        return read_reply(self.f)

    def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Reply]:
        self.sock.sendall(b"".join(encode_command(c) for c in commands))
        return [read_reply(self.f) for _ in commands]

    def close(self) -> None:
        self.f.close()
        self.sock.close()


def free_port() -> int:
    """A port nobody listens on right now (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """A real redis-server (Debian's), the oracle: no persistence, loopback only."""

    def __init__(self, workdir: Path) -> None:
        last: Exception | None = None
        for _ in range(5):  # another process may take the free port before we bind it
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(workdir),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                self._wait()
                return
            except (OSError, TimeoutError) as exc:
                last = exc
                self.stop()
        raise RuntimeError(f"redis-server did not start: {last}")

    def _wait(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise OSError("redis-server exited")
            try:
                c = RawClient(self.port, timeout=2)
                ok = c.call("PING").raw == b"+PONG\r\n"
                c.close()
                if ok:
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("redis-server did not answer PING")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@contextlib.contextmanager
def oracle_pair(workdir: Path) -> Iterator[tuple[int, int]]:
    """A real redis-server (the oracle) and a pion-server (no fsync), data under
    ``workdir``: their ports, in that order; both stopped on exit."""
    oracle = RedisServer(workdir)
    try:
        pion = ServerThread(ServerConfig(port=0, dir=workdir / "pion", appendfsync="no")).start()
        try:
            yield oracle.port, pion.port
        finally:
            pion.stop()
    finally:
        oracle.stop()


def scan_all(c: RawClient, *options: Arg) -> Iterator[bytes]:
    """Every key a full SCAN iteration returns (with duplicates, if any)."""
    cursor: Arg = 0
    while True:
        reply = c.call("SCAN", cursor, *options).value
        if isinstance(reply, Err):
            raise AssertionError(f"SCAN failed: {reply.line!r}")
        cursor, keys = reply
        yield from keys
        if cursor == b"0":
            return


def damaged(rng: random.Random, payloads: Sequence[bytes], n: int) -> bytes:
    """One of ``payloads`` without its 10-byte footer (version, CRC), damaged as the
    ``n``-th of a run: bytes overwritten, the tail cut, or bytes inserted, in turn."""
    body = bytearray(rng.choice(payloads)[:-10])
    action = n % 3
    if action == 0:
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
    elif action == 1:
        del body[rng.randrange(1, len(body)) :]
    else:
        at = rng.randrange(len(body))
        body[at:at] = rng.randbytes(rng.randint(1, 8))
    return bytes(body)
