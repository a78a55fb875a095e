"""int8 (src/pion/codecs/int8.py): llama.cpp q8_0, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.codecs import CodecValueError, get_codec
from pion.codecs.int8 import roundf

codec = get_codec("int8")


def c_roundf(v: float) -> float:
    """C roundf on an fp32 value (exact in fp64)."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def q8_0_ref(row: np.ndarray) -> bytes:
    """quantize_row_q8_0_ref from ggml-quants.c, one scalar at a time, in fp32."""
    out = b""
    for b in range(0, len(row), 32):
        block = row[b : b + 32].astype(np.float32)
        amax = np.float32(0)
        for v in block:
            amax = max(amax, np.float32(abs(v)))
        d = np.float32(amax / np.float32(127))
        inv = np.float32(1) / d if d else np.float32(0)
        qs = [int(c_roundf(float(np.float32(v * inv)))) for v in block]
        out += np.float16(d).astype("<f2").tobytes() + np.array(qs, np.int8).tobytes()
    return out


def test_matches_scalar_reference() -> None:
    rng = np.random.default_rng(8)
    scales = np.array([[0.01], [1], [3], [50], [1e3], [1e-4]], np.float32)
    x = rng.standard_normal((6, 96)).astype(np.float32) * scales
    x[2, :32] = np.arange(32) - 15.5  # x * id lands on many .5 ties
    assert codec.encode(x).tobytes() == b"".join(q8_0_ref(r) for r in x)


def test_matches_gguf_reference() -> None:
    import gguf  # pinned in requirements-dev.txt

    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    x[0] = np.round(x[0] * 8) / 8  # exact halves after scaling
    x[1, :32] = 0.0
    want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(codec.encode(x), want)
    deq = gguf.quants.dequantize(want, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(codec.decode(want, 1024), deq)


@pytest.mark.parametrize(
    "v", [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, 126.5, -126.5, 0.0, -0.0]
)
def test_roundf_halves_away_from_zero(v: float) -> None:
    got = roundf(np.array([v], np.float32))[0]
    assert got == c_roundf(float(np.float32(v)))


@settings(deadline=None)
@given(st.lists(st.floats(-128, 128, width=32), min_size=1, max_size=50))
def test_roundf_property(values: list[float]) -> None:
    x = np.array(values, np.float32)
    assert roundf(x).tolist() == [c_roundf(float(v)) for v in x]


def test_row_layout() -> None:
    # One block: [fp16 d][32 x int8]; amax 127 gives d = 1 and q = x.
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 31] = 127.0, -5.0, 2.5
    data = codec.encode(x)[0]
    assert data[:2].tobytes() == bytes.fromhex("003c")  # fp16 1.0
    assert data[2:].view(np.int8).tolist() == [127, -5, *[0] * 29, 3]  # 2.5 -> 3


def test_padding_is_zero_and_dropped() -> None:
    x = np.arange(1, 41, dtype=np.float32).reshape(1, 40)
    data = codec.encode(x)
    assert data.shape == (1, 68)
    assert not data[0, 34 + 2 + 8 :].any()  # block 2 holds 8 values then 24 zeros
    assert codec.decode(data, 40).shape == (1, 40)


def test_block_scale_overflow_is_refused() -> None:
    x = np.ones((3, 64), np.float32)
    x[1, 40] = 9e6  # d = 9e6 / 127 = 70866 > 65504
    with pytest.raises(CodecValueError) as err:
        codec.encode(x)
    assert err.value.row == 1
    assert err.value.message == "value 9e+06 at row 1 overflows the fp16 block scale of int8"


def test_largest_block_scale_is_stored() -> None:
    x = np.full((1, 32), 65504.0 * 127, np.float32)
    assert np.array_equal(codec.decode(codec.encode(x), 32), np.full((1, 32), 65504.0 * 127))


def test_tiny_blocks_decode_to_zero_like_llama_cpp() -> None:
    # d = amax/127 underflows fp16 to 0: llama.cpp stores d = 0 and so do we.
    x = np.full((1, 32), 1e-7, np.float32)
    data = codec.encode(x)
    assert data[0, :2].tobytes() == b"\0\0"
    assert not codec.decode(data, 32).any()
    assert data.tobytes() == q8_0_ref(x[0])
