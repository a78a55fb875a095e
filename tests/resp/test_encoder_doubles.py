"""Doubles are printed as Redis 7.0's addReplyDouble prints them (``%.17g``, ``inf``):
a bulk string in RESP2, a ``,`` double in RESP3. Every value round-trips exactly."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.resp.encoder import Chunks, encode_reply


def wire(value: float, proto: int) -> bytes:
    out: Chunks = []
    encode_reply(value, proto, out)
    return b"".join(bytes(c) for c in out)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, b"1"),
        (2.5, b"2.5"),
        (0.1, b"0.10000000000000001"),
        (1e20, b"1e+20"),
        (-0.0, b"-0"),
        (1.1, b"1.1000000000000001"),
        (math.inf, b"inf"),
        (-math.inf, b"-inf"),
    ],
)
def test_redis_7_0_text(value: float, text: bytes) -> None:
    assert wire(value, 2) == b"$%d\r\n%s\r\n" % (len(text), text)
    assert wire(value, 3) == b",%s\r\n" % text


@settings(max_examples=500, derandomize=True)
@given(st.floats(allow_nan=False))
def test_round_trips(value: float) -> None:
    text = wire(value, 3)[1:-2]
    assert float(text) == value and math.copysign(1, float(text)) == math.copysign(1, value)
