"""bf16_rope_fp8_body (src/pion/codecs/bf16rope.py): a bf16 rotary prefix and an fp8 body.

The format has a parameter (``rope``), so it is not in the seven-format contract suite
(test_contract.py builds codecs by name alone); this file holds its version of that
contract, a plain reference built from ml_dtypes, its layout, golden bytes and bounds.
"""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.codecs import MAX_DIM, CodecValueError, get_codec
from pion.codecs.bf16rope import BF16_OVERFLOW_BITS, from_bf16, to_bf16
from pion.errors import CodecError, PionError

NAME = "bf16_rope_fp8_body"
BF16 = np.dtype(ml_dtypes.bfloat16)
fp8 = get_codec("fp8")


def codec_of(rope: int) -> object:
    return get_codec(NAME, rope)


def reference(x: np.ndarray, rope: int) -> bytes:
    """The module docstring, written plainly: ml_dtypes' bf16 cast, then the fp8 codec's
    own bytes for the rest of the row."""
    out = b""
    for row in x:
        out += row[:rope].astype(BF16).tobytes()
        out += fp8.encode(row[None, rope:]).tobytes()
    return out


def rel_mse(x: np.ndarray, y: np.ndarray) -> float:
    x64 = x.astype(np.float64)
    return float(((x64 - y) ** 2).sum() / (x64**2).sum())


@pytest.mark.parametrize(("dim", "rope"), [(512, 64), (576, 64), (100, 7), (2, 1), (8192, 8191)])
def test_matches_reference(dim: int, rope: int) -> None:
    codec = get_codec(NAME, rope)
    rng = np.random.default_rng(dim + rope)
    x = rng.standard_normal((6, dim)).astype(np.float32)
    x[1] *= 1e-3
    x[2] *= 1e3
    x[3] = 0.0
    x[4, : min(rope, 5)] = -0.0
    assert codec.encode(x).tobytes() == reference(x, rope)


def test_row_bytes() -> None:
    assert get_codec(NAME, 64).row_bytes(1024) == 128 + 30 * 34 == 1148
    assert get_codec(NAME, 64).row_bytes(512) == 128 + 14 * 34 == 604  # Pion's example
    assert get_codec(NAME, 64).row_bytes(576) == 128 + 16 * 34
    # A body that is not a multiple of 32 is padded (Pion refuses it).
    assert get_codec(NAME, 7).row_bytes(100) == 14 + 3 * 34
    assert get_codec(NAME, 1).row_bytes(2) == 2 + 34


def test_row_layout() -> None:
    codec = get_codec(NAME, 2)
    x = np.zeros((1, 34), np.float32)
    x[0, 0], x[0, 1] = 1.0, -2.5  # bf16 0x3f80, 0xc020
    x[0, 2], x[0, 3] = 448.0, -1.0  # body: scale 1.0, codes are the values themselves
    data = codec.encode(x)[0]
    assert data.shape == (4 + 34,)
    assert data[:4].tobytes() == bytes.fromhex("803f20c0")
    assert data[4:6].tobytes() == bytes.fromhex("003c")  # fp16 1.0
    assert data[6] == 0x7E  # 448
    assert data[7] == 0xB8  # -1.0
    assert not data[8:].any()


def test_rope_part_is_bf16_exactly() -> None:
    codec = get_codec(NAME, 64)
    x = np.random.default_rng(3).standard_normal((64, 512)).astype(np.float32)
    y = codec.decode(codec.encode(x), 512)
    assert np.array_equal(y[:, :64], x[:, :64].astype(BF16).astype(np.float32))
    # and the body is exactly what the fp8 format stores
    assert np.array_equal(y[:, 64:], fp8.decode(fp8.encode(x[:, 64:]), 448))


def test_to_bf16_equals_ml_dtypes_dense_sample() -> None:
    # Every 97th fp32 bit pattern below the overflow threshold, both signs, plus every
    # pattern around a rounding tie and around the overflow threshold itself.
    patterns = [
        np.arange(0, BF16_OVERFLOW_BITS, 97 * 1021, dtype=np.uint32),
        np.arange(0x3F808000 - 4096, 0x3F808000 + 4096, dtype=np.uint32),
        np.arange(BF16_OVERFLOW_BITS - 0x10000, BF16_OVERFLOW_BITS, dtype=np.uint32),
        np.arange(0, 0x20000, dtype=np.uint32),  # zero and the subnormals
    ]
    for u in patterns:
        for v in (u.view(np.float32), -u.view(np.float32)):
            assert np.array_equal(to_bf16(v), v.astype(BF16).view("<u2"))
            assert np.array_equal(from_bf16(to_bf16(v)), v.astype(BF16).astype(np.float32))


def test_gaussian_error_bound(gaussian_rows: np.ndarray) -> None:
    codec = get_codec(NAME, 64)
    y = codec.decode(codec.encode(gaussian_rows), 1024)
    assert rel_mse(gaussian_rows, y) < 1.2e-3  # fp8's bound: the body dominates
    assert rel_mse(gaussian_rows[:, :64], y[:, :64]) < 5e-6  # measured 2.7e-6
    # The rope part is more precise than the fp8 body (the point of the format).
    assert rel_mse(gaussian_rows[:, :64], y[:, :64]) < rel_mse(gaussian_rows[:, 64:], y[:, 64:])


def test_each_rope_value_is_relative_error_at_most_2_pow_minus_8() -> None:
    codec = get_codec(NAME, 32)
    x = (np.random.default_rng(5).standard_normal((200, 64)) * 1e4).astype(np.float32)
    y = codec.decode(codec.encode(x), 64)
    rel = np.abs(y[:, :32] - x[:, :32]) / np.abs(x[:, :32])
    assert rel.max() <= 2.0**-8  # 8 significant bits, rounded to nearest


def test_zero_rows_round_trip_to_zero() -> None:
    codec = get_codec(NAME, 16)
    data = codec.encode(np.zeros((3, 100), np.float32))
    assert not data.any()  # an all-zero input row is all-zero bytes
    assert not codec.decode(np.zeros((2, codec.row_bytes(100)), np.uint8), 100).any()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("col", [3, 80])  # in the rope part, in the body
def test_non_finite_input_is_refused_with_its_row(bad: float, col: int) -> None:
    x = np.ones((5, 100), np.float32)
    x[2, col] = bad
    with pytest.raises(CodecValueError) as err:
        get_codec(NAME, 16).encode(x)
    assert err.value.row == 2
    assert err.value.message == "non-finite value at row 2"


def test_bf16_overflow_is_refused_with_its_row() -> None:
    codec = get_codec(NAME, 16)
    top = np.uint32(BF16_OVERFLOW_BITS - 1).view(np.float32)  # rounds to bf16's max
    x = np.ones((4, 64), np.float32)
    x[1, 3] = -top
    y = codec.decode(codec.encode(x), 64)
    assert np.isfinite(y).all()
    x[2, 5] = np.uint32(BF16_OVERFLOW_BITS).view(np.float32)  # would round to inf
    with pytest.raises(CodecValueError) as err:
        codec.encode(x)
    assert err.value.row == 2
    assert "overflows bf16" in err.value.message


def test_body_scale_overflow_is_refused_with_its_row() -> None:
    x = np.ones((3, 64), np.float32)
    x[1, 40] = 3e38  # fine for bf16 if it were in the rope part; not for an fp8 scale
    with pytest.raises(CodecValueError) as err:
        get_codec(NAME, 16).encode(x)
    assert err.value.row == 1
    assert "overflows" in err.value.message


@pytest.mark.parametrize("dim", [0, 16, 10, MAX_DIM + 1])
def test_dim_must_exceed_rope(dim: int) -> None:
    codec = get_codec(NAME, 16)
    with pytest.raises(CodecError):
        codec.row_bytes(dim)
    with pytest.raises(CodecError):
        codec.decode(b"", dim)
    if 0 < dim <= MAX_DIM:
        with pytest.raises(CodecError, match="needs dim > rope"):
            codec.encode(np.ones((1, dim), np.float32))


def test_truncated_buffer_is_refused() -> None:
    codec = get_codec(NAME, 16)
    flat = codec.encode(np.ones((3, 100), np.float32)).reshape(-1)
    for cut in (1, codec.row_bytes(100) - 1, codec.row_bytes(100) + 1):
        with pytest.raises(CodecError, match="truncated"):
            codec.decode(flat[:-cut], 100)


def test_errors_are_pion_errors() -> None:
    with pytest.raises(PionError):
        get_codec(NAME, 0)
    assert issubclass(CodecValueError, PionError)


def test_decode_accepts_flat_buffers_and_views() -> None:
    codec = get_codec(NAME, 8)
    x = np.random.default_rng(2).standard_normal((3, 100)).astype(np.float32)
    data = codec.encode(x)
    want = codec.decode(data, 100)
    for buf in (data.reshape(-1), data.tobytes(), bytearray(data.tobytes())):
        assert np.array_equal(codec.decode(buf, 100), want)
    assert want.flags.c_contiguous and want.dtype == np.float32


# Frozen bytes: data written with this format must decode the same forever.
GOLDEN_SMALL = np.array([[0.5, -1.25, 3.0, 0.0, -0.001, 7.75, -2.5, 1.0]], np.float32)
# rope 3: bf16 0.5 = 0x3f00, -1.25 = 0xbfa0, 3.0 = 0x4040; then fp8 of the other five:
# s = fp16(7.75/448) = 0x246e; 0.0 -> 0x00, -0.001 -> 0x97, 7.75 -> 0x7e, -2.5 -> 0xf1,
# 1.0 -> 0x66 (the same codes as test_codecs_golden's fp8 literal), 27 zero pads.
GOLDEN_SMALL_HEX = "003fa0bf4040" + "6e24" + "00977ef166" + "00" * 27
GOLDEN_SHA256 = "5efe4ddfb884ebdcc80c33e4088a110ef41bdc8d451006bf0f39785699a8b0f4"


def golden_input() -> np.ndarray:
    """The input of test_codecs_golden (4 x 200), with rope 40."""
    rng = np.random.default_rng(0x9107)
    x = rng.standard_normal((4, 200)).astype(np.float32)
    x[1] *= 30.0
    x[2] = 0.0
    x[3, :50] *= 1e-3
    return x


def test_small_literal() -> None:
    codec = get_codec(NAME, 3)
    assert codec.encode(GOLDEN_SMALL).tobytes().hex() == GOLDEN_SMALL_HEX
    y = codec.decode(bytes.fromhex(GOLDEN_SMALL_HEX), 8)
    assert np.abs(y - GOLDEN_SMALL).max() < 0.1


def test_encoded_bytes_are_frozen() -> None:
    data = get_codec(NAME, 40).encode(golden_input())
    assert hashlib.sha256(data.tobytes()).hexdigest() == GOLDEN_SHA256


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 6),
    dim=st.integers(2, 300),
    rope_frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
    log_scale=st.floats(-3, 3),
)
def test_round_trip_property(
    n: int, dim: int, rope_frac: float, seed: int, log_scale: float
) -> None:
    rope = min(dim - 1, max(1, int(rope_frac * dim)))
    codec = get_codec(NAME, rope)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, dim)) * 10**log_scale).astype(np.float32)
    x[rng.random((n, dim)) < 0.2] = 0.0
    data = codec.encode(x)
    assert data.shape == (n, codec.row_bytes(dim))
    assert np.array_equal(data, codec.encode(x))
    assert data.tobytes() == reference(x, rope)
    y = codec.decode(data, dim)
    assert y.shape == x.shape and np.isfinite(y).all()
    err = ((x.astype(np.float64) - y) ** 2).sum(axis=1)
    energy = (x.astype(np.float64) ** 2).sum(axis=1)
    assert (err <= 4 * 1.2e-3 * energy + 1e-30).all()
