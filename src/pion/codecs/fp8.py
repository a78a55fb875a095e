"""fp8: OCP E4M3FN codes with one fp16 scale per 32-value block (format id 6).

Row layout for dim ``d``: ``nb = ceil(d / 32)`` blocks of 34 bytes (the same block shape
as int8/q8_0, so both formats share one layout)::

    block b at offset 34*b:
      +0   s_b      little-endian fp16 scale
      +2   c_b[32]  float8_e4m3fn codes; value j decodes as s_b * e4m3fn(c_b[j])

The last block is zero-padded when ``d`` is not a multiple of 32; decode drops it.

Encoding::

    amax = max |x_j|                  (fp32)
    s    = fp16(amax / 448)           (448 = largest E4M3FN value; refused if > 65504)
    id   = s ? 1/s : 0                (fp32, from the *stored* fp16 scale)
    c_j  = e4m3fn(clip(x_j * id, -448, 448))   (as ml_dtypes casts: nearest even)

Quantizing against the stored (rounded) scale, not the fp32 one, keeps decode consistent
with what was encoded. The clip makes the format saturating: fp16 rounding of ``s`` can
push ``x*id`` slightly past 448, and ml_dtypes casts do not saturate (they give NaN).
A block with ``amax`` below about 1.3e-5 gets ``s = 0`` in fp16 and decodes to zeros.
"""

from __future__ import annotations

from typing import ClassVar

import ml_dtypes
import numpy as np

from pion.codecs.base import (
    F16_LE,
    Codec,
    F32Array,
    U8Array,
    as_blocks,
    blocks_of,
    check_fp16_range,
    from_blocks,
    interleave_blocks,
    split_blocks,
)
from pion.codecs.compiled import quant

__all__ = ["Fp8Codec", "to_e4m3fn"]

BLOCK = 32
E4M3_MAX = np.float32(448.0)
_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
# All 256 codes decoded once: a table lookup is several times faster than ml_dtypes'
# element-wise cast. Codes 0x7F/0xFF are NaN; encode never writes them.
_DECODE_LUT: F32Array = np.arange(256, dtype=np.uint8).view(_E4M3).astype(np.float32)
_DECODE_LUT.setflags(write=False)


def to_e4m3fn(v: F32Array) -> U8Array:
    """E4M3FN codes of fp32 values already clipped to +-448: ``v.astype(float8_e4m3fn)``.

    Bit-identical to the ml_dtypes cast (round to nearest even, -0.0 -> 0x80), checked
    for every fp32 value in [-448, 448] when this was written and on a dense sample by
    tests/codecs/test_fp8.py, and about twice as fast, which matters at 4M values per
    layer. Normal results round the fp32 mantissa to 3 bits and rebias the exponent
    (127 -> 7); results below 2**-6 are subnormal multiples of 2**-9.
    """
    u = v.view(np.uint32)
    sign = (u >> 24).astype(np.uint8) & np.uint8(0x80)
    mag = u & np.uint32(0x7FFFFFFF)
    # Round to nearest even at bit 20: add 0x7FFFF plus the lowest kept bit.
    r = mag + np.uint32(0x7FFFF)
    r += (mag >> 20) & np.uint32(1)
    r >>= 20
    codes = (r - np.uint32((127 - 7) << 3)).astype(np.uint8)
    sub = mag < np.uint32(0x3C800000)  # |v| < 2**-6, the smallest normal E4M3FN value
    if sub.any():
        s = mag[sub].view(np.float32) * np.float32(512)
        codes[sub] = np.rint(s).astype(np.uint8)
    codes |= sign
    return codes


class Fp8Codec(Codec):
    name: ClassVar[str] = "fp8"
    format_id: ClassVar[int] = 6

    def row_bytes(self, dim: int) -> int:
        return blocks_of(dim, BLOCK) * (2 + BLOCK)

    def _encode(self, x: F32Array, row_max: F32Array) -> U8Array:
        blocks = as_blocks(x, BLOCK)
        amax = np.abs(blocks).max(axis=2)
        scale = amax / E4M3_MAX
        check_fp16_range(scale, "the fp16 block scale of fp8", amax)
        s16 = scale.astype(F16_LE)
        s = s16.astype(np.float32)
        inv = np.zeros_like(s)
        np.divide(np.float32(1), s, out=inv, where=s > 0)
        v = blocks * inv[:, :, None]
        np.clip(v, -E4M3_MAX, E4M3_MAX, out=v)
        codes = to_e4m3fn(v)
        return interleave_blocks(s16, codes)

    compiled: ClassVar[bool] = quant is not None

    def _encode_into(self, x: F32Array, out: U8Array) -> bool:
        return bool(quant.fp8_encode(x, out, x.shape[1]))

    def _decode_into(self, data: U8Array, dim: int, out: F32Array) -> bool:
        return bool(quant.fp8_decode(data, out, dim, _DECODE_LUT))

    def _decode(self, data: U8Array, dim: int) -> F32Array:
        nb = blocks_of(dim, BLOCK)
        s, c = split_blocks(data, nb, BLOCK)
        out = _DECODE_LUT[c]
        out *= s[:, :, None]
        return from_blocks(out, dim)
