"""mlx4g32 (src/pion/codecs/mlx4.py): MLX affine int4, group 32, bit-exact with mx.quantize.

The cross-check runs where ``mlx`` imports (Linux: ``pip install "mlx[cpu]"``); the
scalar reference and the hand-verified bytes below hold everywhere.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from pion.codecs import CodecValueError, get_codec

codec = get_codec("mlx4g32")


def mlx_group_ref(w: np.ndarray) -> tuple[list[int], np.float16, np.float16]:
    """MLX's CPU affine quantize for one group of 32 fp16 values, scalar by scalar."""
    f = [np.float32(v) for v in w]
    w_max, w_min = max(f), min(f)
    mask = abs(w_min) > abs(w_max)
    scale = max(np.float32(w_max - w_min) / np.float32(15), np.float32(1e-7))
    scale = scale if mask else -scale
    edge = w_min if mask else w_max
    q0 = np.rint(np.float32(edge / scale))
    bias = np.float32(0)
    if q0 != 0:
        scale = np.float32(edge / q0)
        bias = edge
    codes = [int(min(max(np.rint(np.float32((v - bias) / scale)), 0), 15)) for v in f]
    return codes, np.float16(scale), np.float16(bias)


def reference(x: np.ndarray) -> bytes:
    n, dim = x.shape
    g = -(-dim // 32)
    w = np.zeros((n, g * 32), np.float16)
    w[:, :dim] = x
    out = b""
    for row in w:
        codes, scales, biases = [], [], []
        for group in row.reshape(g, 32):
            c, s, b = mlx_group_ref(group)
            codes += c
            scales.append(s)
            biases.append(b)
        packed = bytes(codes[i] | codes[i + 1] << 4 for i in range(0, len(codes), 2))
        out += packed + np.array(scales, "<f2").tobytes() + np.array(biases, "<f2").tobytes()
    return out


def test_matches_scalar_reference() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 70)).astype(np.float32)
    x[1] = 3.25  # constant row: scale -1e-7, bias carries the value
    x[2, :32] = -2.0
    x[3] *= 1e-4
    x[4, 5] = -60000.0
    x[5] = np.round(x[5] * 4) / 4  # values that land on .5 before rint
    assert codec.encode(x).tobytes() == reference(x)


def test_hand_verified_group() -> None:
    # w = 0, 1, ..., 31: |min| > |max| is false, so the edge is w_max = 31;
    # scale = -(31/15) -> q0 = rint(31 / -2.0667) = -15 -> scale = 31/-15, bias = 31;
    # code(w) = rint((w - 31) / (-31/15)) = rint((31 - w) * 15/31): 15 at w=0, 0 at w=31.
    x = np.arange(32, dtype=np.float32).reshape(1, 32)
    data = codec.encode(x)[0]
    want_codes = [round((31 - w) * 15 / 31) for w in range(32)]  # no .5 ties here
    packed = bytes(want_codes[i] | want_codes[i + 1] << 4 for i in range(0, 32, 2))
    assert data[:16].tobytes() == packed
    assert data.tobytes().hex() == "ffeeddccbbaa9988776655443322110022c0c04f"
    assert data[16:18].tobytes() == np.float16(31 / -15).astype("<f2").tobytes()  # 0xc022
    assert data[16:18].tobytes() == bytes.fromhex("22c0")
    assert data[18:20].tobytes() == bytes.fromhex("c04f")  # fp16 31.0
    y = codec.decode(data, 32)[0]
    assert y[0] == np.float32(np.float16(31 / -15)) * 15 + 31
    assert y[31] == 31.0


def test_constant_and_zero_groups_are_exact() -> None:
    x = np.zeros((3, 64), np.float32)
    x[1] = 0.7
    x[2, :32] = -123.5
    y = codec.decode(codec.encode(x), 64)
    assert np.array_equal(y, x.astype(np.float16).astype(np.float32))


def test_input_beyond_fp16_is_refused() -> None:
    x = np.zeros((3, 40), np.float32)
    x[2, 39] = 70000.0
    with pytest.raises(CodecValueError) as err:
        codec.encode(x)
    assert err.value.row == 2
    assert err.value.message == "value 70000 at row 2 overflows fp16 (mlx4g32 input)"


def test_row_layout_offsets() -> None:
    # dim 64: 32 code bytes, then 2 scales, then 2 biases.
    x = np.zeros((1, 64), np.float32)
    x[0, :32] = 5.0  # constant group 0: bias 5
    x[0, 32:] = -1.0  # constant group 1: bias -1
    data = codec.encode(x)[0]
    assert data.shape == (40,)
    assert not data[:32].any()
    assert data[36:40].view("<f2").tolist() == [5.0, -1.0]


@pytest.fixture(scope="module")
def mx() -> ModuleType:
    # A pinned test dependency (requirements-dev.txt): missing, it fails, never skips.
    import mlx.core

    return mlx.core


@pytest.mark.parametrize("dim", [32, 96, 1024, 1000, 7])
def test_bit_exact_with_mx_quantize(mx: ModuleType, dim: int) -> None:
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((64, dim)).astype(np.float32)
    x[1] *= 1e-3
    x[2] *= 3e3
    x[3] = np.round(x[3] * 2) / 2
    x[4] = 1.5
    x[5] = 0.0
    x[6, : dim // 2] = -7.0
    data = codec.encode(x)
    g = -(-dim // 32)
    w = np.zeros((64, g * 32), np.float16)
    w[:, :dim] = x
    q, s, b = mx.quantize(mx.array(w), group_size=32, bits=4)
    q, s, b = np.array(q), np.array(s), np.array(b)
    assert q.dtype == np.uint32 and s.dtype == np.float16 and b.dtype == np.float16
    want = np.concatenate(
        [
            q.astype("<u4").view(np.uint8),
            s.astype("<f2").view(np.uint8),
            b.astype("<f2").view(np.uint8),
        ],
        axis=1,
    )
    assert np.array_equal(data, want)
    # Decode = mx.dequantize with the scales and biases widened to fp32.
    deq = mx.dequantize(
        mx.array(q),
        mx.array(s.astype(np.float32)),
        mx.array(b.astype(np.float32)),
        group_size=32,
        bits=4,
    )
    np.testing.assert_allclose(
        codec.decode(data, dim), np.array(deq)[:, :dim], rtol=0, atol=1e-6 * 3e3
    )


def test_bit_exact_with_mx_quantize_extremes(mx: ModuleType) -> None:
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((256, 256)) * np.logspace(-6, 4.5, 256)[:, None]).astype(np.float32)
    x = np.clip(x, -65504, 65504)
    q, s, b = mx.quantize(mx.array(x.astype(np.float16)), group_size=32, bits=4)
    want = np.concatenate(
        [np.array(q).view(np.uint8), np.array(s).view(np.uint8), np.array(b).view(np.uint8)], axis=1
    )
    assert np.array_equal(codec.encode(x), want)
