"""fp8 (src/pion/codecs/fp8.py): E4M3FN codes, fp16 scale per 32-block, saturating."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pion.codecs import CodecValueError, get_codec
from pion.codecs.fp8 import to_e4m3fn

codec = get_codec("fp8")
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)


def reference(x: np.ndarray) -> bytes:
    """docs/protocol.md, "Storage formats", written plainly with the ml_dtypes cast."""
    n, dim = x.shape
    nb = -(-dim // 32)
    padded = np.zeros((n, nb * 32), np.float32)
    padded[:, :dim] = x
    out = b""
    for row in padded:
        for block in row.reshape(nb, 32):
            s16 = np.float16(np.abs(block).max() / np.float32(448))
            s = np.float32(s16)
            inv = np.float32(1) / s if s else np.float32(0)
            codes = np.clip(block * inv, -448, 448).astype(E4M3)
            out += np.array(s16, "<f2").tobytes() + codes.tobytes()
    return out


def test_matches_reference() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, 100)).astype(np.float32)
    x[1] *= 1e-3
    x[2] *= 1e3
    x[3, :40] = 0.0
    x[4] *= 1e-6  # fp16 scales are subnormal
    assert codec.encode(x).tobytes() == reference(x)


def test_to_e4m3fn_equals_ml_dtypes_dense_sample() -> None:
    # Every 211th fp32 bit pattern in [0, 448] and its negation, plus every pattern near
    # the subnormal/normal boundary (2**-6) and at the top of the range. (Checked against
    # ml_dtypes on all 2.3e9 patterns in [-448, 448] when written; that takes a minute.)
    top = int(np.float32(448).view(np.uint32))
    boundary = int(np.float32(2.0**-6).view(np.uint32))
    patterns = [
        np.arange(0, top + 1, 211, dtype=np.uint32),
        np.arange(boundary - 0x100000, boundary + 0x100000, dtype=np.uint32),
        np.arange(top - 0x100000, top + 1, dtype=np.uint32),
    ]
    for u in patterns:
        for v in (u.view(np.float32), -u.view(np.float32)):
            assert np.array_equal(to_e4m3fn(v), v.astype(E4M3).view(np.uint8))


def test_saturates_instead_of_nan() -> None:
    # fp16 rounding of amax/448 can shrink the scale so that x/s > 448: clip, not NaN.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2000, 32)).astype(np.float32)
    y = codec.decode(codec.encode(x), 32)
    assert np.isfinite(y).all()
    data = codec.encode(x).reshape(-1, 34)[:, 2:]
    assert not np.isin(data, [0x7F, 0xFF]).any()  # the NaN codes are never written


def test_row_layout() -> None:
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = 448.0, -1.0  # scale 1.0, codes are the values themselves
    data = codec.encode(x)[0]
    assert data[:2].tobytes() == bytes.fromhex("003c")
    assert data[2] == 0x7E  # 448 = 1.75 * 2**8
    assert data[3] == 0xB8  # -1.0
    assert not data[4:].any()


def test_block_scale_overflow_is_refused() -> None:
    x = np.ones((2, 40), np.float32)
    x[1, 33] = 3e7  # 3e7 / 448 = 66964 > 65504
    with pytest.raises(CodecValueError) as err:
        codec.encode(x)
    assert err.value.row == 1
    assert err.value.message == "value 3e+07 at row 1 overflows the fp16 block scale of fp8"
