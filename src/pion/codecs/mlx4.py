"""mlx4g32: MLX affine int4 with group size 32, bit-exact with ``mx.quantize`` (format id 7).

The row is first rounded to fp16 (values beyond +-65504 are refused) and zero-padded to
``dp = 32 * ceil(d / 32)`` values. The stored bytes are then exactly what
``mx.quantize(w_fp16, group_size=32, bits=4)`` returns for that padded fp16 row: fp16
input is what makes MLX produce the fp16 scales and biases this layout stores.

Row layout for dim ``d`` (``G = dp / 32`` groups, ``dp/2 + 4*G`` bytes)::

    offset 0          codes: dp/8 little-endian uint32 words; word w holds values
                      8w .. 8w+7, value 8w+k in bits 4k..4k+3 (LSB first). Byte i
                      therefore holds value 2i in its low nibble, 2i+1 in its high one.
    offset dp/2       scales: G little-endian fp16
    offset dp/2+2G    biases: G little-endian fp16
    value j of group g decodes as scale_g * code_j + bias_g

Encoding (MLX's CPU ``quantize`` in mlx/backend/cpu/quantized.cpp, all arithmetic in
fp32 on the fp16 inputs; checked against mlx 0.32.4 by tests/codecs/test_mlx4.py)::

    w_max, w_min = max, min of the group
    mask  = |w_min| > |w_max|
    scale = max((w_max - w_min) / 15, 1e-7)      then negated unless mask
    edge  = w_min if mask else w_max
    q0    = rint(edge / scale)                   (round half to even)
    if q0 != 0: scale = edge / q0; bias = edge   else: bias = 0
    code  = clip(rint((w - bias) / scale), 0, 15)
    store fp16(scale), fp16(bias)

So the edge value with the larger magnitude is represented exactly, and a constant group
(``max == min``) keeps ``scale = -1e-7`` and stores the constant as its bias: it decodes
exactly. An all-zero group stores codes 0, bias 0 and scale fp16(-1e-7), decoding to 0.
Decode computes ``scale * code + bias`` in fp32 (``mx.dequantize`` with fp32 scales and
biases gives the same numbers).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from pion.codecs.base import (
    F16_LE,
    FP16_MAX,
    Codec,
    CodecValueError,
    F32Array,
    U8Array,
    as_blocks,
    blocks_of,
    pack4,
    round_to_fp16,
    unpack4,
)
from pion.codecs.compiled import quant

__all__ = ["Mlx4G32Codec"]

GROUP = 32
_N_BINS = np.float32(15)
_EPS = np.float32(1e-7)


class Mlx4G32Codec(Codec):
    name: ClassVar[str] = "mlx4g32"
    format_id: ClassVar[int] = 7

    def row_bytes(self, dim: int) -> int:
        g = blocks_of(dim, GROUP)
        return g * (GROUP // 2 + 4)

    def _encode(self, x: F32Array, row_max: F32Array) -> U8Array:
        over = row_max > FP16_MAX
        if over.any():
            row = int(np.argmax(over))
            raise CodecValueError.overflow(float(row_max[row]), row, "fp16 (mlx4g32 input)")
        # MLX reads its fp16 input as float: round to fp16, keep computing in fp32.
        n, dim = x.shape
        groups = as_blocks(round_to_fp16(x), GROUP)
        g = groups.shape[1]
        w_max = groups.max(axis=2)
        w_min = groups.min(axis=2)
        mask = np.abs(w_min) > np.abs(w_max)
        scale = np.maximum((w_max - w_min) / _N_BINS, _EPS)
        np.negative(scale, out=scale, where=~mask)
        edge = np.where(mask, w_min, w_max)
        q0 = np.rint(edge / scale)
        nz = q0 != 0
        np.divide(edge, q0, out=scale, where=nz)
        bias = np.where(nz, edge, np.float32(0))
        v = groups - bias[:, :, None]
        v /= scale[:, :, None]
        np.rint(v, out=v)
        np.clip(v, 0, 15, out=v)
        codes = pack4(v.astype(np.uint8).reshape(n, g * GROUP))
        out = np.empty((n, self.row_bytes(dim)), np.uint8)
        nc = g * GROUP // 2
        out[:, :nc] = codes
        out[:, nc : nc + 2 * g] = scale.astype(F16_LE).view(np.uint8)
        out[:, nc + 2 * g :] = bias.astype(F16_LE).view(np.uint8)
        return out

    compiled: ClassVar[bool] = quant is not None

    def _encode_into(self, x: F32Array, out: U8Array) -> bool:
        return bool(quant.mlx4_encode(x, out, x.shape[1]))

    def _decode_into(self, data: U8Array, dim: int, out: F32Array) -> bool:
        return bool(quant.mlx4_decode(data, out, dim))

    def _decode(self, data: U8Array, dim: int) -> F32Array:
        n = data.shape[0]
        g = blocks_of(dim, GROUP)
        nc = g * GROUP // 2
        scale = np.ascontiguousarray(data[:, nc : nc + 2 * g]).view(F16_LE).astype(np.float32)
        bias = np.ascontiguousarray(data[:, nc + 2 * g :]).view(F16_LE).astype(np.float32)
        vals = unpack4(data[:, :nc]).astype(np.float32).reshape(n, g, GROUP)
        vals *= scale[:, :, None]
        vals += bias[:, :, None]
        out = vals.reshape(n, g * GROUP)
        return out if dim == g * GROUP else np.ascontiguousarray(out[:, :dim])
