"""Reply encoding in RESP2 and RESP3, checked by parsing it back with hiredis."""

from __future__ import annotations

from typing import Any

import hiredis
import numpy as np
import pytest

from pion.resp.encoder import SMALL_BULK, encode_reply
from pion.resp.reply import NO_REPLY, ErrorReply, NullArray, Reply, Simple, Verbatim


def wire(value: Reply, proto: int) -> bytes:
    out: list[bytes | memoryview] = []
    encode_reply(value, proto, out)
    return b"".join(bytes(c) for c in out)


def parse(data: bytes) -> Any:
    reader = hiredis.Reader()
    reader.feed(data)
    return reader.gets()


@pytest.mark.parametrize(
    ("value", "resp2", "resp3"),
    [
        (Simple("OK"), b"+OK\r\n", b"+OK\r\n"),
        (Simple("HIT"), b"+HIT\r\n", b"+HIT\r\n"),
        (7, b":7\r\n", b":7\r\n"),
        (-3, b":-3\r\n", b":-3\r\n"),
        (10**12, b":1000000000000\r\n", b":1000000000000\r\n"),
        (True, b":1\r\n", b"#t\r\n"),
        (None, b"$-1\r\n", b"_\r\n"),
        (NullArray(), b"*-1\r\n", b"_\r\n"),
        (b"ab", b"$2\r\nab\r\n", b"$2\r\nab\r\n"),
        ("é", b"$2\r\n\xc3\xa9\r\n", b"$2\r\n\xc3\xa9\r\n"),
        (1.5, b"$3\r\n1.5\r\n", b",1.5\r\n"),
        ([1, b"x"], b"*2\r\n:1\r\n$1\r\nx\r\n", b"*2\r\n:1\r\n$1\r\nx\r\n"),
        ({"a": 1}, b"*2\r\n$1\r\na\r\n:1\r\n", b"%1\r\n$1\r\na\r\n:1\r\n"),
        (ErrorReply("ERR bad\r\nthing"), b"-ERR bad  thing\r\n", b"-ERR bad  thing\r\n"),
        (Verbatim("a:1"), b"$3\r\na:1\r\n", b"=7\r\ntxt:a:1\r\n"),
        (NO_REPLY, b"", b""),
    ],
)
def test_encodings(value: Reply, resp2: bytes, resp3: bytes) -> None:
    assert wire(value, 2) == resp2
    assert wire(value, 3) == resp3


def test_memoryview_payload_is_not_copied() -> None:
    arr = np.arange(1000, dtype=np.float32)
    view = memoryview(arr).cast("B")
    out: list[bytes | memoryview] = []
    encode_reply(view, 2, out)
    assert out[1] is view
    assert parse(b"".join(bytes(c) for c in out)) == arr.tobytes()


def test_nested_map_resp3_parses() -> None:
    data = wire({"server": "pion", "modules": [], "proto": 3}, 3)
    assert parse(data) == {b"server": b"pion", b"modules": [], b"proto": 3}


def test_small_bulks_are_one_chunk_large_ones_keep_their_value() -> None:
    small: list[bytes | memoryview] = []
    encode_reply(b"x" * SMALL_BULK, 2, small)
    assert small == [b"$%d\r\n" % SMALL_BULK + b"x" * SMALL_BULK + b"\r\n"]
    big_value = b"y" * (SMALL_BULK + 1)
    big: list[bytes | memoryview] = []
    encode_reply(big_value, 2, big)
    assert len(big) == 3 and big[1] is big_value  # never copied
