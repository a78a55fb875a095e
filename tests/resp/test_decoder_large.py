"""Large bulks (DIRECT_BULK_MIN and up) are received in place, into a buffer of their
size: every way of cutting the wire into feeds gives the same commands, what follows a
large bulk in the same feed is kept, a fed buffer may be reused by the caller, and a
payload not followed by CRLF is still refused."""

from __future__ import annotations

import random

import pytest

from pion.errors import ProtocolError
from pion.resp.decoder import DIRECT_BULK_MIN, RequestDecoder


def encode(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def drain(dec: RequestDecoder) -> list[list[bytes]]:
    out = []
    while (cmd := dec.get()) is not None:
        out.append(cmd)
    return out


def commands() -> list[list[bytes]]:
    rng = random.Random(5)
    big = rng.randbytes(DIRECT_BULK_MIN + 7)
    huge = rng.randbytes(3 * DIRECT_BULK_MIN)
    return [
        [b"SET", b"k", big],
        [b"PING"],
        [b"MSET", b"a", huge, b"b", big, b"c", b"x"],
        [b"SET", b"edge", rng.randbytes(DIRECT_BULK_MIN)],  # exactly the threshold
        [b"GET", b"k"],
    ]


@pytest.mark.parametrize("seed", range(12))
def test_any_cut_of_the_wire_gives_the_same_commands(seed: int) -> None:
    cmds = commands()
    wire = b"".join(encode(c) for c in cmds)
    rng = random.Random(seed)
    dec = RequestDecoder()
    got: list[list[bytes]] = []
    pos = 0
    while pos < len(wire):
        # Cuts from 1 byte (splitting CRLFs and headers) to 300 KB.
        step = rng.choice([1, 2, 3, 17, 4096, 65536, 300_000])
        piece = wire[pos : pos + step]
        dec.feed(piece if seed % 3 else memoryview(bytearray(piece)))
        pos += step
        got.extend(drain(dec))
    assert got == cmds
    assert dec.buffered == 0


def test_one_feed_holding_everything() -> None:
    cmds = commands()
    dec = RequestDecoder()
    dec.feed(b"".join(encode(c) for c in cmds))
    assert drain(dec) == cmds


def test_a_fed_buffer_may_be_reused_by_the_caller() -> None:
    payload = bytes(range(256)) * 2048
    wire = encode([b"SET", b"k", payload])
    dec = RequestDecoder()
    scratch = bytearray(65536)
    for i in range(0, len(wire), 65536):
        n = len(wire[i : i + 65536])
        scratch[:n] = wire[i : i + 65536]
        dec.feed(memoryview(scratch)[:n])
        scratch[:n] = b"\xee" * n  # the transport reuses its buffer
    assert drain(dec) == [[b"SET", b"k", payload]]


def test_missing_crlf_after_a_large_bulk_is_refused() -> None:
    payload = b"x" * (DIRECT_BULK_MIN + 1)
    wire = b"*2\r\n$3\r\nSET\r\n$%d\r\n" % len(payload) + payload + b"XX"
    dec = RequestDecoder()
    dec.feed(wire[:1000])
    assert dec.get() is None
    dec.feed(wire[1000:])
    with pytest.raises(ProtocolError, match="not terminated by CRLF"):
        dec.get()
