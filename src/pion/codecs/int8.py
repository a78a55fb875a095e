"""int8: llama.cpp ``q8_0``, byte for byte (format id 1).

Row layout for dim ``d``: ``nb = ceil(d / 32)`` blocks of 34 bytes, exactly ggml's
``block_q8_0`` (so a row is a valid q8_0 tensor row of ``32*nb`` values)::

    block b at offset 34*b:
      +0   d_b      little-endian fp16 scale
      +2   q_b[32]  int8 codes; value j of the block decodes as d_b * q_b[j]

The last block is padded with zeros when ``d`` is not a multiple of 32; decode drops
the padding.

Encoding mirrors ``quantize_row_q8_0_ref`` in ggml-quants.c, the reference used to
create model files::

    amax = max |x_j|            (fp32)
    d    = amax / 127           (fp32)
    id   = d ? 1/d : 0          (fp32)
    q_j  = roundf(x_j * id)     (round half away from zero)
    store fp16(d)               (round to nearest even)

Note the codes are computed from the fp32 ``d`` while decode multiplies by the fp16
``d``, as in llama.cpp. A block whose ``d`` exceeds 65504 (``amax > 8.3e6``) is refused.
One guarded deviation: where ``1/d`` would overflow fp32 (``amax < 3.7e-37``, where the
C code's result is undefined) the block's codes are zero; fp16(d) is 0 there anyway, so
the decoded block is zero in both.
"""

from __future__ import annotations

from typing import ClassVar

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

__all__ = ["Int8Codec", "roundf"]

BLOCK = 32
# Smallest d whose reciprocal is finite in fp32 (1/d < FLT_MAX).
_MIN_D = np.float32(1.0) / np.finfo(np.float32).max


def roundf(v: F32Array) -> F32Array:
    """C ``roundf`` on fp32: nearest integer, halfway cases away from zero.

    ``np.rint`` rounds halves to even, so exact ties (rare in real data, common in
    synthetic data) are found and redone; ``trunc(x + 0.5)`` would be wrong at
    x = 0.49999997, where fp32 rounds the sum up to 1.0. Returns a new array.
    """
    r = np.rint(v)
    frac = v - r  # exact: r is within 0.5 of v
    ties = np.abs(frac, out=frac) == 0.5
    if ties.any():
        t = v[ties]
        r[ties] = t + np.copysign(np.float32(0.5), t)  # k + 0.5 +- 0.5 is exact
    return r


class Int8Codec(Codec):
    name: ClassVar[str] = "int8"
    format_id: ClassVar[int] = 1

    def row_bytes(self, dim: int) -> int:
        return blocks_of(dim, BLOCK) * (2 + BLOCK)

    def _encode(self, x: F32Array, row_max: F32Array) -> U8Array:
        blocks = as_blocks(x, BLOCK)
        amax = np.abs(blocks).max(axis=2)
        d = amax / np.float32(127)
        check_fp16_range(d, "the fp16 block scale of int8", amax)
        inv = np.zeros_like(d)
        np.divide(np.float32(1), d, out=inv, where=d >= _MIN_D)
        q = roundf(blocks * inv[:, :, None])
        codes = q.astype(np.int8).view(np.uint8)
        return interleave_blocks(d.astype(F16_LE), codes)

    compiled: ClassVar[bool] = quant is not None

    def _encode_into(self, x: F32Array, out: U8Array) -> bool:
        return bool(quant.int8_encode(x, out, x.shape[1]))

    def _decode_into(self, data: U8Array, dim: int, out: F32Array) -> bool:
        return bool(quant.int8_decode(data, out, dim))

    def _decode(self, data: U8Array, dim: int) -> F32Array:
        nb = blocks_of(dim, BLOCK)
        d, q = split_blocks(data, nb, BLOCK)
        out = q.view(np.int8).astype(np.float32)
        out *= d[:, :, None]
        return from_blocks(out, dim)
