"""Shared codec helpers (src/pion/codecs/base.py): fp16 rounding, packing, errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.codecs.base import (
    FP16_MAX,
    CodecValueError,
    interleave_blocks,
    pack2,
    pack4,
    round_to_fp16,
    split_blocks,
    unpack2,
    unpack4,
)
from pion.errors import CodecError


def numpy_fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def test_round_to_fp16_dense_sample() -> None:
    # Every 997th fp32 bit pattern in [0, 65504] and its negation, plus every pattern near
    # the subnormal/normal boundary (2**-14) and at the top of the range. (The helper was
    # checked against numpy on all 2.4e9 patterns when written; that takes minutes.)
    top = int(np.float32(FP16_MAX).view(np.uint32))
    boundary = int(np.float32(2.0**-14).view(np.uint32))
    patterns = [
        np.arange(0, top + 1, 997, dtype=np.uint32),
        np.arange(boundary - 0x20000, boundary + 0x20000, dtype=np.uint32),
        np.arange(top - 0x20000, top + 1, dtype=np.uint32),
    ]
    for u in patterns:
        for x in (u.view(np.float32), -u.view(np.float32)):
            got = round_to_fp16(x).view(np.uint32)
            assert np.array_equal(got, numpy_fp16(x).view(np.uint32))


@given(st.floats(-FP16_MAX, FP16_MAX, width=32))
def test_round_to_fp16_property(v: float) -> None:
    x = np.array([v], np.float32)
    assert round_to_fp16(x).view(np.uint32)[0] == numpy_fp16(x).view(np.uint32)[0]


@settings(deadline=None)
@given(st.lists(st.integers(0, 15), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0))
def test_pack4_round_trip(codes: list[int]) -> None:
    a = np.array(codes, np.uint8)
    packed = pack4(a)
    assert packed[0] == codes[0] | codes[1] << 4  # first code in the low nibble
    assert np.array_equal(unpack4(packed), a)


@settings(deadline=None)
@given(st.lists(st.integers(0, 3), min_size=4, max_size=64).filter(lambda v: len(v) % 4 == 0))
def test_pack2_round_trip(codes: list[int]) -> None:
    a = np.array(codes, np.uint8)
    packed = pack2(a)
    assert packed[0] == codes[0] | codes[1] << 2 | codes[2] << 4 | codes[3] << 6
    assert np.array_equal(unpack2(packed), a)


def test_interleave_blocks_layout() -> None:
    fields = np.array([[1.0, -2.0]], "<f2")
    payload = np.arange(6, dtype=np.uint8).reshape(1, 2, 3)
    out = interleave_blocks(fields, payload)
    assert out.tobytes() == (
        np.float16(1.0).astype("<f2").tobytes()
        + bytes([0, 1, 2])
        + np.float16(-2.0).astype("<f2").tobytes()
        + bytes([3, 4, 5])
    )
    got_fields, got_payload = split_blocks(out, 2, 3)
    assert got_fields.tolist() == [[1.0, -2.0]]
    assert np.array_equal(got_payload, payload)


def test_codec_value_error_messages() -> None:
    e = CodecValueError.overflow(1e6, 2, "fp16")
    assert e.message == "value 1e+06 at row 2 overflows fp16"
    assert e.detail == "value 1e+06 overflows fp16"
    assert e.row == 2
    assert e.resp_line() == "ERR value 1e+06 at row 2 overflows fp16"
    assert isinstance(e, CodecError)
    n = CodecValueError.non_finite(3)
    assert (n.message, n.detail, n.row) == ("non-finite value at row 3", "non-finite value", 3)


def test_codec_value_error_label() -> None:
    e = CodecValueError.overflow(70000.0, 0, "the fp16 norm of turbo4", label="group norm")
    assert e.message == "group norm 70000 at row 0 overflows the fp16 norm of turbo4"


def test_round_to_fp16_keeps_input() -> None:
    x = np.array([1.0001, -3e-6], np.float32)
    before = x.copy()
    round_to_fp16(x)
    assert np.array_equal(x, before)


@pytest.mark.parametrize("v", [0.0, -0.0, 65504.0, -65504.0, 6.1e-5, 5.96e-8, 2.98e-8])
def test_round_to_fp16_edges(v: float) -> None:
    x = np.array([v], np.float32)
    assert round_to_fp16(x).view(np.uint32)[0] == numpy_fp16(x).view(np.uint32)[0]
