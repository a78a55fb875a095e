"""The binary lane's sans-IO frame parser and request parser: whole, byte by byte,
pipelined, and with garbage (any input yields frames, None, or a FrameError)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.server.binary_wire import (
    HEADER,
    MAGIC,
    OP_PING,
    OP_QUERY_FUSED,
    STATUS_OK,
    BodyError,
    Frame,
    FrameError,
    FrameParser,
    encode_frame,
    parse_query_fused,
)


def frame(opcode: int, body: bytes = b"") -> bytes:
    return HEADER.pack(MAGIC, opcode, len(body)) + body


def drain(parser: FrameParser) -> list[tuple[int, bytes]]:
    out = []
    while (f := parser.next()) is not None:
        out.append((f.opcode, bytes(f.body)))
    return out


def fused_body(
    sid: bytes = b"s", *, h_q: int = 4, m: int = 2, d: int = 8, h_kv: int = 2, s_suf: int = 3
) -> bytes:
    fixed = struct.pack("<HHHHII", 7, h_q, d, h_kv, m, s_suf)
    data = bytes(range(256)) * 64
    q = data[: h_q * m * d * 4]
    kv = data[: h_kv * s_suf * d * 4]
    return struct.pack("<H", len(sid)) + sid + fixed + q + kv + kv + bytes(h_q)


def test_whole_pipelined_and_byte_by_byte() -> None:
    stream = frame(OP_PING) + frame(0x24, b"abc") + frame(0x99, b"x" * 300)
    want = [(OP_PING, b""), (0x24, b"abc"), (0x99, b"x" * 300)]
    whole = FrameParser(1 << 20)
    whole.feed(stream)
    assert drain(whole) == want and whole.buffered == 0
    slow = FrameParser(1 << 20)
    got = []
    for i in range(len(stream)):
        slow.feed(stream[i : i + 1])
        got += drain(slow)
    assert got == want


def test_bad_magic_is_refused_after_two_bytes() -> None:
    p = FrameParser(100)
    p.feed(b"\x5e")
    assert p.next() is None
    p.feed(b"\xcb")
    with pytest.raises(FrameError, match="bad magic 0xCB5E"):
        p.next()
    p.feed(frame(OP_PING))  # final: nothing after a frame error is parsed
    with pytest.raises(FrameError):
        p.next()


def test_oversized_body_is_refused_at_the_header() -> None:
    p = FrameParser(1000)
    p.feed(HEADER.pack(MAGIC, OP_QUERY_FUSED, 1001))  # no body sent at all
    with pytest.raises(FrameError, match="body length 1001 exceeds the limit of 1000"):
        p.next()


def test_frames_before_an_error_come_out_first() -> None:
    p = FrameParser(100)
    p.feed(frame(OP_PING) + b"\x00\x00garbage")
    assert p.next() == Frame(OP_PING, b"")
    with pytest.raises(FrameError, match="bad magic"):
        p.next()


def test_truncated_and_limit_changes() -> None:
    p = FrameParser(10)
    assert p.truncated() is None
    p.feed(HEADER.pack(MAGIC, 1, 5)[:4])
    assert p.truncated() == "truncated frame: 4 of 7 header bytes"
    p.feed(HEADER.pack(MAGIC, 1, 5)[4:] + b"ab")
    assert p.next() is None
    assert p.truncated() == "truncated frame: 2 of 5 body bytes"
    p.feed(b"cde")
    assert p.next() == Frame(1, b"abcde")
    p.max_body = 2
    p.feed(frame(1, b"xyz"))
    with pytest.raises(FrameError, match="limit of 2"):
        p.next()


def test_encode_frame() -> None:
    assert b"".join(encode_frame(STATUS_OK)) == frame(STATUS_OK)
    body = memoryview(np.arange(3, dtype="<f4")).cast("B")
    parts = encode_frame(3, body)
    assert parts[1] is body and bytes(parts[0]) == HEADER.pack(MAGIC, 3, 12)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.lists(st.integers(1, 9), max_size=8))
def test_garbage_yields_frames_none_or_frame_error(data: bytes, cuts: list[int]) -> None:
    p = FrameParser(32)
    pos = 0
    for cut in [*cuts, len(data)]:
        p.feed(data[pos : pos + cut])
        pos += cut
        try:
            while (f := p.next()) is not None:
                assert isinstance(f, Frame) and len(f.body) <= 32
        except FrameError:
            return


def test_parse_query_fused() -> None:
    body = fused_body(b"ns_attn")
    req = parse_query_fused(body)
    assert (req.sid, req.layer, req.h_q, req.d, req.h_kv, req.m, req.s_suf) == (
        b"ns_attn",
        7,
        4,
        8,
        2,
        2,
        3,
    )
    assert (len(req.q), len(req.k_suf), len(req.v_suf), len(req.head_map)) == (256, 192, 192, 4)
    assert req.fa_window == -1
    assert parse_query_fused(body + struct.pack("<I", 0xFFFFFFFF)).fa_window == -1
    assert parse_query_fused(body + struct.pack("<I", 512)).fa_window == 512
    no_suffix = parse_query_fused(fused_body(s_suf=0))
    assert len(no_suffix.k_suf) == len(no_suffix.v_suf) == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x01", "shorter than its session id length"),
        (struct.pack("<H", 0), "session id length 0"),
        (struct.pack("<H", 600) + b"x" * 600, "session id length 600"),
        (struct.pack("<H", 1) + b"s" + b"\0" * 5, "shorter than its fixed fields"),
        (fused_body()[:-1], "but its fields declare"),
        (fused_body() + b"\0\0", "but its fields declare"),
    ],
)
def test_parse_query_fused_refuses_what_does_not_add_up(body: bytes, message: str) -> None:
    with pytest.raises(BodyError, match=message):
        parse_query_fused(body)
