"""The binary lane over real TCP on port+1: PING, QUERY_FUSED against the reference,
COLDMISS, MISS for unknown opcodes and unparsable bodies, ERROR for bad values, AUTH,
LOADING, and the frames that close the connection (bad magic, oversized body,
truncated frame) without stalling it or touching the other connections."""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis

from pion.config import ProtocolLimits
from pion.server.binary import MAX_PREAUTH_BODY
from pion.server.binary_wire import (
    HEADER,
    MAGIC,
    OP_AUTH,
    OP_PING,
    OP_QUERY_FUSED,
    STATUS_COLDMISS,
    STATUS_ERROR,
    STATUS_MISS,
    STATUS_OK,
)
from pion.server.run import ServerThread
from support.attend import reference

RNG = np.random.default_rng(3)
H_KV, H_Q, N, D = 2, 8, 50, 16


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


class Lane:
    """A raw binary-lane client."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def send(self, opcode: int, body: bytes = b"", *, magic: int = MAGIC) -> None:
        self.sock.sendall(HEADER.pack(magic, opcode, len(body)) + body)

    def recv(self) -> tuple[int, bytes]:
        head = self._exactly(HEADER.size)
        magic, status, size = HEADER.unpack(head)
        assert magic == MAGIC
        return status, self._exactly(size)

    def call(self, opcode: int, body: bytes = b"") -> tuple[int, bytes]:
        self.send(opcode, body)
        return self.recv()

    def closed(self) -> bool:
        """True once the server has closed the connection (EOF)."""
        return self.sock.recv(1) == b""

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


def fused(
    sid: bytes,
    q: np.ndarray,
    ks: np.ndarray,
    vs: np.ndarray,
    hm: np.ndarray,
    *,
    layer: int = 0,
    fa_window: int | None = None,
    m: int | None = None,
) -> bytes:
    h_q, rows, d = q.shape
    h_kv, s_suf, _ = ks.shape
    body = struct.pack("<H", len(sid)) + sid
    body += struct.pack("<HHHHII", layer, h_q, d, h_kv, rows if m is None else m, s_suf)
    body += q.tobytes() + ks.tobytes() + vs.tobytes() + hm.astype(np.uint8).tobytes()
    if fa_window is not None:
        body += struct.pack("<I", fa_window & 0xFFFFFFFF)
    return body


@pytest.fixture
def lane_server(server_factory: Callable[..., ServerThread]) -> Iterator[Callable[..., Any]]:
    """A server holding one prefix layer ``kv`` at sid ``s``; yields a Lane opener."""
    lanes: list[Lane] = []

    def make(**config: Any) -> tuple[ServerThread, Lane, tuple[np.ndarray, np.ndarray]]:
        server = server_factory(**config)
        k, v = rand(H_KV, N, D), rand(H_KV, N, D)
        c = redis.Redis(port=server.port, password=config.get("requirepass"))
        c.execute_command("ATTEND.PREFIX.STORE", "s", 0, H_KV, N, D, k.tobytes(), v.tobytes())
        assert server.binary_port == server.port + 1
        lane = Lane(server.binary_port)
        lanes.append(lane)
        return server, lane, (k, v)

    yield make
    for lane in lanes:
        lane.close()


def test_ping_and_query_fused_match_the_reference(lane_server: Callable[..., Any]) -> None:
    _, lane, (k, v) = lane_server()
    assert lane.call(OP_PING) == (STATUS_OK, b"")
    q, ks, vs = rand(H_Q, 3, D), rand(H_KV, 4, D), rand(H_KV, 4, D)
    hm = np.arange(H_Q) // 4
    for window in (None, -1, 0, 9):
        status, body = lane.call(OP_QUERY_FUSED, fused(b"s", q, ks, vs, hm, fa_window=window))
        assert status == STATUS_OK and len(body) == q.nbytes
        want = reference(q, k, v, hm, window=max(0, window or 0), k_suf=ks, v_suf=vs)[0]
        np.testing.assert_allclose(np.frombuffer(body, "<f4").reshape(q.shape), want, atol=2e-5)
    empty = np.zeros((H_KV, 0, D), np.float32)
    status, body = lane.call(OP_QUERY_FUSED, fused(b"s", q, empty, empty, hm))
    want = reference(q, k, v, hm)[0]
    np.testing.assert_allclose(np.frombuffer(body, "<f4").reshape(q.shape), want, atol=2e-5)


def test_coldmiss_status(lane_server: Callable[..., Any]) -> None:
    server, lane, _ = lane_server(attend_warm_slots=1)
    c = redis.Redis(port=server.port)
    c.execute_command(
        "ATTEND.PREFIX.STORE",
        "t",
        0,
        H_KV,
        2,
        D,
        rand(H_KV, 2, D).tobytes(),
        rand(H_KV, 2, D).tobytes(),
    )
    q, e = rand(H_Q, 1, D), np.zeros((H_KV, 0, D), np.float32)
    status, body = lane.call(OP_QUERY_FUSED, fused(b"s", q, e, e, np.arange(H_Q) // 4))
    assert (status, body) == (
        STATUS_COLDMISS,
        b"COLDMISS session evicted to cold tier (call KV.PREFIX.WARM)",
    )


@pytest.mark.parametrize(
    ("mutate", "status", "message"),
    [
        (lambda b: b + b"\0", STATUS_MISS, b"unparsable body"),
        (lambda b: b[:5], STATUS_MISS, b"unparsable body"),
        (lambda b: struct.pack("<H", 1) + b"x" + b[3:], STATUS_ERROR, b"session not found"),
    ],
)
def test_bad_bodies_keep_the_connection(
    lane_server: Callable[..., Any], mutate: Callable[[bytes], bytes], status: int, message: bytes
) -> None:
    _, lane, _ = lane_server()
    q, e = rand(H_Q, 1, D), np.zeros((H_KV, 0, D), np.float32)
    got, body = lane.call(OP_QUERY_FUSED, mutate(fused(b"s", q, e, e, np.arange(H_Q) // 4)))
    assert got == status and message in body
    assert lane.call(OP_PING) == (STATUS_OK, b"")


def test_bad_values_are_errors(lane_server: Callable[..., Any]) -> None:
    _, lane, _ = lane_server()
    e = np.zeros((H_KV, 0, D), np.float32)
    hm = np.arange(H_Q) // 4
    nan_q = rand(H_Q, 1, D)
    nan_q[0, 0, 0] = np.nan
    cases = [
        (fused(b"s", rand(H_Q, 0, D), e, e, hm, m=0), b"Q blob size 0"),  # M = 0
        (fused(b"s", nan_q, e, e, hm), b"Q holds non-finite"),
        (fused(b"s", rand(H_Q, 1, D), e, e, hm + 1), b"head_map value 2 out of range"),
        (
            fused(b"s", rand(6, 1, D), rand(4, 0, D), rand(4, 0, D), np.zeros(6)),
            b"multiple of H_kv",
        ),
        (fused(b"s", rand(H_Q, 1, D), e, e, hm, fa_window=-5), b"fa_window must be >= -1"),
    ]
    for body, message in cases:
        status, reply = lane.call(OP_QUERY_FUSED, body)
        assert status == STATUS_ERROR and message in reply, reply
    status, reply = lane.call(0x42, b"whatever")
    assert (status, reply) == (STATUS_MISS, b"ERR unknown opcode 0x42")
    assert lane.call(OP_PING) == (STATUS_OK, b"")


@pytest.mark.parametrize("case", ["bad magic", "oversized", "truncated"])
def test_fatal_frames_are_answered_and_closed(lane_server: Callable[..., Any], case: str) -> None:
    server, lane, _ = lane_server(protocol=ProtocolLimits(max_binary_body=4096))
    bystander = Lane(server.binary_port)
    resp = redis.Redis(port=server.port)
    try:
        if case == "bad magic":
            lane.send(OP_PING, magic=0xBEEF)
            want = b"ERR Protocol error: bad magic 0xBEEF (want 0xCA5E)"
        elif case == "oversized":
            lane.sock.sendall(HEADER.pack(MAGIC, OP_QUERY_FUSED, 4097))  # the header alone
            want = b"ERR Protocol error: body length 4097 exceeds the limit of 4096 bytes"
        else:
            lane.sock.sendall(HEADER.pack(MAGIC, OP_QUERY_FUSED, 100) + b"x" * 10)
            lane.sock.shutdown(socket.SHUT_WR)
            want = b"ERR Protocol error: truncated frame: 10 of 100 body bytes"
        assert lane.recv() == (STATUS_ERROR, want)
        assert lane.closed()
        assert bystander.call(OP_PING) == (STATUS_OK, b"")
        assert resp.ping()
        info = resp.info("stats")
        assert info["total_protocol_errors"] == 1
    finally:
        bystander.close()


def test_auth(lane_server: Callable[..., Any]) -> None:
    server, lane, _ = lane_server(requirepass="s3cret")
    q, e = rand(H_Q, 1, D), np.zeros((H_KV, 0, D), np.float32)
    query = fused(b"s", q, e, e, np.arange(H_Q) // 4)
    assert lane.call(OP_PING) == (STATUS_OK, b"")
    assert lane.call(OP_QUERY_FUSED, query) == (STATUS_ERROR, b"NOAUTH Authentication required.")
    assert lane.call(0x42) == (STATUS_ERROR, b"NOAUTH Authentication required.")
    status, body = lane.call(OP_AUTH, b"wrong")
    assert status == STATUS_ERROR and body.startswith(b"WRONGPASS")
    assert lane.call(OP_AUTH, b"s3cret") == (STATUS_OK, b"")
    assert lane.call(OP_QUERY_FUSED, query)[0] == STATUS_OK
    # Before AUTH, a frame may not promise more than Redis's pre-auth bulk limit.
    other = Lane(server.binary_port)
    try:
        other.sock.sendall(HEADER.pack(MAGIC, OP_QUERY_FUSED, MAX_PREAUTH_BODY + 1))
        status, body = other.recv()
        assert status == STATUS_ERROR and b"exceeds the limit of 16384" in body
        assert other.closed()
    finally:
        other.close()


def test_auth_without_a_password_and_loading(lane_server: Callable[..., Any]) -> None:
    server, lane, _ = lane_server()
    status, body = lane.call(OP_AUTH, b"pw")
    assert status == STATUS_ERROR and b"without any password configured" in body
    q, e = rand(H_Q, 1, D), np.zeros((H_KV, 0, D), np.float32)
    server.state.loading = True
    try:
        status, body = lane.call(OP_QUERY_FUSED, fused(b"s", q, e, e, np.arange(H_Q) // 4))
        assert status == STATUS_ERROR and body.startswith(b"LOADING")
    finally:
        server.state.loading = False


def test_lane_can_be_off_or_elsewhere(server_factory: Callable[..., ServerThread]) -> None:
    off = server_factory(binary_lane=False)
    assert off.binary_port == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    moved = server_factory(binary_port=free)
    lane = Lane(free)
    try:
        assert moved.binary_port == free and lane.call(OP_PING) == (STATUS_OK, b"")
    finally:
        lane.close()


def test_random_frames_never_break_the_lane(lane_server: Callable[..., Any]) -> None:
    """Well-framed garbage (random opcodes, random bodies, bodies that are almost a
    valid QUERY_FUSED) is answered frame by frame; the lane and the server live on."""
    server, lane, _ = lane_server()
    rng = np.random.default_rng(99)
    e = np.zeros((H_KV, 0, D), np.float32)
    valid = fused(b"s", rand(H_Q, 1, D), e, e, np.arange(H_Q) // 4)
    for i in range(200):
        kind = i % 4
        if kind == 0:
            opcode, body = int(rng.integers(0, 256)), rng.bytes(int(rng.integers(0, 300)))
        elif kind == 1:  # a valid body with random bytes flipped
            raw = bytearray(valid)
            for pos in rng.integers(0, len(raw), 3):
                raw[pos] = int(rng.integers(0, 256))
            opcode, body = OP_QUERY_FUSED, bytes(raw)
        elif kind == 2:  # a valid body cut or extended
            cut = int(rng.integers(0, len(valid) + 8))
            opcode, body = OP_QUERY_FUSED, (valid + rng.bytes(8))[:cut]
        else:
            opcode, body = OP_QUERY_FUSED, valid
        if opcode == OP_AUTH:
            continue
        status, reply = lane.call(opcode, body)
        assert status in (STATUS_OK, STATUS_MISS, STATUS_ERROR, STATUS_COLDMISS)
        if kind == 3:
            assert status == STATUS_OK and len(reply) == H_Q * D * 4
    assert lane.call(OP_PING) == (STATUS_OK, b"")
    assert redis.Redis(port=server.port).info("stats")["total_internal_errors"] == 0


def test_lane_queries_are_timed_and_counted_as_the_resp_command(
    lane_server: Callable[..., Any],
) -> None:
    """The lane's queries pass the one error boundary: INFO commandstats counts them
    (calls and failed calls), errorstats counts their errors, SLOWLOG logs them."""
    server, lane, _ = lane_server()
    c = redis.Redis(port=server.port)
    c.config_set("slowlog-log-slower-than", 0)
    q, e = rand(H_Q, 1, D), np.zeros((H_KV, 0, D), np.float32)
    hm = np.arange(H_Q) // 4
    assert lane.call(OP_QUERY_FUSED, fused(b"s", q, e, e, hm))[0] == STATUS_OK
    assert lane.call(OP_QUERY_FUSED, fused(b"x", q, e, e, hm))[0] == STATUS_ERROR
    row = c.info("commandstats")["cmdstat_attend.prefix.query_fused"]
    assert (row["calls"], row["failed_calls"]) == (2, 1)
    assert c.info("errorstats")["errorstat_ERR"]["count"] >= 1
    logged = [e["command"] for e in c.slowlog_get(128)]
    assert any(cmd.startswith(b"ATTEND.PREFIX.QUERY_FUSED x") for cmd in logged), logged
