"""turbo4 / turbo3 / turbo2: TurboQuant-style rotated Lloyd-Max codes (format ids 2, 3, 4).

After Zandieh et al., "TurboQuant" (arXiv 2504.19874), MSE variant. A row is zero-padded
to ``dp = 128 * ceil(d / 128)`` values and cut into ``G = dp / 128`` groups of 128.
For each group ``g`` (fp32 throughout)::

    n      = ||g||                                   (L2 norm)
    u      = g / n                                   (u = 0 when n = 0)
    y      = D(s2) . (H / sqrt(128)) . D(s1) . u     (a fixed random rotation)
    idx_j  = nearest Lloyd-Max centroid of y_j for N(0, 1/128), b bits per coordinate
    norm'  = n / ||C[idx]||                          (stored as fp16; refused if > 65504)

and decode is ``g' = D(s1) . (H / sqrt(128)) . D(s2) . (norm' * C[idx])``, so a decoded
group has the input's norm up to fp16 rounding. ``H`` is the 128x128 Sylvester
Walsh-Hadamard matrix, ``H[i, j] = (-1) ** popcount(i & j)``; ``D(s)`` is diag(s).
The rotation makes every coordinate of ``y`` close to N(0, 1/128) whatever the input's
distribution (outlier channels are spread over the group), which is what the fixed
centroid tables are optimal for.

Sign vectors (frozen; part of the on-disk format). ``s1``, ``s2`` are drawn once as
``np.random.default_rng(250419874).integers(0, 2, size=(2, 128), dtype=np.uint8)``
(the seed is the paper's arXiv number); row 0 gives s1, row 1 gives s2, bit 1 meaning
-1. Because numpy does not promise that stream forever, the bits are written below as
hex constants (bit j of the integer is position j) and those constants are the
definition; tests/codecs/test_turbo.py checks they still match it.

Centroids: the positive halves listed in docs/protocol.md ("Storage formats"),
``c_0 < ... < c_{K-1}`` (``K = 2**(b-1)``), mirrored for negative values. A
coordinate's b-bit code is ``sign << (b-1) | mag``:
``sign = 1`` iff ``y_j < 0``; ``mag`` = the number of midpoints ``(c_k + c_{k+1}) / 2``
strictly below ``|y_j|`` (so an exact tie goes to the smaller magnitude). The code
decodes to ``(-1)**sign * c_mag``.

Row layout: G blocks, one per group, block g at offset ``g * B``::

    turbo4 (B = 66):  +0 norm' (fp16 LE)  +2 64 bytes: byte i = code[2i] | code[2i+1] << 4
    turbo3 (B = 50):  +0 norm' (fp16 LE)  +2 32 bytes magnitude plane: byte i =
                      mag[4i] | mag[4i+1] << 2 | mag[4i+2] << 4 | mag[4i+3] << 6
                      +34 16 bytes sign plane: bit k (LSB first) of byte i = sign[8i+k]
    turbo2 (B = 34):  +0 norm' (fp16 LE)  +2 32 bytes: byte i =
                      code[4i] | code[4i+1] << 2 | code[4i+2] << 4 | code[4i+3] << 6

An all-zero block decodes to zeros (norm' = 0), whatever its codes.

The rotation is computed as ``H128 = H8 (x) H16`` (Kronecker product): two small matrix
products per group, batched over all groups of all rows at once. CPU time for 32768
groups on the dev machine: 7-stage butterfly on strided views 37 ms (constant-geometry
FWHT; the textbook in-place one is 120 ms, its short inner loops cost more than the
arithmetic), butterflies on a transposed [128, M] copy 52 ms, dense 128x128 matmul
15-22 ms, Kronecker form 11-16 ms: we keep the fastest. The entries are +-1, so every
product is exact; only the order of the 8- or 16-term sums is up to BLAS, which can move
a result by an ulp on another machine and so, very rarely, flip a code that sits exactly
on a centroid midpoint (decoding is unaffected by how bytes were produced).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import numpy as np

from pion.codecs.base import (
    F16_LE,
    FP16_MAX,
    Codec,
    CodecValueError,
    F32Array,
    U8Array,
    blocks_of,
    interleave_blocks,
    pack2,
    pack4,
    split_blocks,
)
from pion.codecs.compiled import quant

__all__ = [
    "CENTROIDS",
    "GROUP",
    "S1",
    "S2",
    "SIGN_SEED",
    "Turbo2Codec",
    "Turbo3Codec",
    "Turbo4Codec",
    "hadamard",
]

GROUP = 128
SIGN_SEED = 250419874
_S1_BITS = 0xDC6A0FB00947153911846B361CF6317D
_S2_BITS = 0x0333986169B6E4F4FE38194EB9DA8699

# Positive halves of the Lloyd-Max levels for N(0, 1/128) (N(0,1) levels / sqrt(128)),
# docs/protocol.md ("Storage formats"). Not the narrower 4-bit table (outer level
# 0.1739) of some forks.
CENTROIDS: Mapping[int, tuple[float, ...]] = MappingProxyType(
    {
        2: (0.040020, 0.133503),
        3: (0.021663, 0.066822, 0.118786, 0.190207),
        4: (0.011349, 0.034299, 0.058050, 0.083292, 0.111036, 0.143016, 0.182877, 0.241529),
    }
)


def _signs(bits: int) -> F32Array:
    return np.array([-1.0 if bits >> j & 1 else 1.0 for j in range(GROUP)], np.float32)


def _sylvester(n: int) -> F32Array:
    return np.array(
        [[-1.0 if bin(i & j).count("1") & 1 else 1.0 for j in range(n)] for i in range(n)],
        np.float32,
    )


def _frozen(a: F32Array) -> F32Array:
    """Module tables are part of the format: make accidental writes fail loudly."""
    a.setflags(write=False)
    return a


S1: F32Array = _frozen(_signs(_S1_BITS))
S2: F32Array = _frozen(_signs(_S2_BITS))
_H8 = _frozen(_sylvester(8))
_H16 = _frozen(_sylvester(16))
_INV_SQRT_GROUP = np.float32(1.0 / math.sqrt(GROUP))
# D(s1) / sqrt(128), applied after the inverse Hadamard on decode.
_S1_SCALED: F32Array = _frozen(S1 * _INV_SQRT_GROUP)


def halving_sum(t: F32Array) -> F32Array:
    """Row sums of ``t [M, 2**k]`` in a fixed order: the right half added to the left
    half, halving until one column is left. numpy's own reductions (``sum``,
    ``einsum``) pick their order by build and CPU; this one is part of the format, so
    the compiled twin (``_speedups.c``) produces the same bits."""
    while t.shape[1] > 1:
        half = t.shape[1] // 2
        t = t[:, :half] + t[:, half:]
    out: F32Array = t[:, 0]
    return out


def hadamard(x: F32Array) -> F32Array:
    """``H128 @ v`` for every row ``v`` of ``x [M, 128]`` (unnormalised), as ``H8 (x) H16``.

    Index ``16*a + b`` factors as (a, b); ``H128[16a+b, 16c+d] = H8[a, c] * H16[b, d]``.
    """
    m = x.shape[0]
    # Both factors as batched per-group products, on purpose: each BLAS call is tiny and
    # stays single-threaded. Writing the H16 step as one (8m x 16) GEMM is a little
    # faster on an idle machine, but that GEMM is big enough for OpenBLAS to thread it,
    # and with the other cores busy (a loaded server) it ran 3x slower than this.
    y = x.reshape(m, 8, 16) @ _H16
    out: F32Array = np.matmul(_H8, y).reshape(m, GROUP)
    return out


class _TurboCodec(Codec):
    """Shared encode/decode; subclasses fix ``bits`` and their byte packing.

    Decode and the encoder's centroid-norm sum work on whole payload *bytes* through
    256-entry tables (a byte holds 2 or 4 codes), which halves or quarters the number of
    gathers compared with unpacking codes first.
    """

    bits: ClassVar[int]

    def __init__(self) -> None:
        c = np.array(CENTROIDS[self.bits], np.float64)
        self._centroids = c.astype(np.float32)
        self._thresholds = ((c[:-1] + c[1:]) / 2).astype(np.float32)
        self._c2 = (c * c).astype(np.float32)
        self._payload = GROUP * self.bits // 8
        self._tables = b""  # set by each subclass once its byte tables exist

    compiled: ClassVar[bool] = quant is not None

    def _compiled_tables(self, byte_c2: F32Array) -> bytes:
        """Everything ``_quant.c``'s Turbo struct holds, in its order: the format's
        tables as this module defines them, so the C code has no copy of its own."""
        k = len(self._centroids)
        thresholds = np.zeros(7, np.float32)
        thresholds[: k - 1] = self._thresholds
        values = np.zeros(16, np.float32)
        values[: 2 * k] = [self._value(code) for code in range(2 * k)]
        parts = [
            S1,
            S2,
            _S1_SCALED,
            thresholds,
            byte_c2,
            values,
            np.array([_INV_SQRT_GROUP], np.float32),
        ]
        head = np.array([self.bits], np.int32).tobytes()
        return head + b"".join(np.ascontiguousarray(p, np.float32).tobytes() for p in parts)

    def _encode_into(self, x: F32Array, out: U8Array) -> bool:
        return bool(quant.turbo_encode(x, out, x.shape[1], self._tables))

    def _decode_into(self, data: U8Array, dim: int, out: F32Array) -> bool:
        return bool(quant.turbo_decode(data, out, dim, self._tables))

    def row_bytes(self, dim: int) -> int:
        return blocks_of(dim, GROUP) * (2 + self._payload)

    def _value(self, code: int) -> float:
        """The centroid a b-bit code stands for: ``sign << (b-1) | mag``."""
        k = len(self._centroids)
        v = float(self._centroids[code % k])
        return -v if code >> (self.bits - 1) else v

    @abc.abstractmethod
    def _pack(self, sign: U8Array, mag: U8Array) -> U8Array:
        """``[M, 128]`` sign bits and magnitudes -> ``[M, payload]`` bytes."""

    @abc.abstractmethod
    def _centroid_norm2(self, payload: U8Array) -> F32Array:
        """``||C[idx]||**2`` per group, from the ``[M, payload]`` bytes."""

    @abc.abstractmethod
    def _values(self, payload: U8Array) -> F32Array:
        """``s2 * C[idx]`` as ``[M, 128]`` fp32, from the ``[M, payload]`` bytes."""

    def _encode(self, x: F32Array, row_max: F32Array) -> U8Array:
        n, dim = x.shape
        g = blocks_of(dim, GROUP)
        s1 = np.tile(S1, g)
        if dim % GROUP:
            flat = np.zeros((n, g * GROUP), np.float32)
            np.multiply(x, s1[:dim], out=flat[:, :dim])
        else:
            flat = x * s1
        groups = flat.reshape(n * g, GROUP)  # D(s1) g, one group per row
        with np.errstate(over="ignore"):  # inf for huge values: refused below
            norm = np.sqrt(halving_sum(groups * groups))
        scale = np.zeros_like(norm)  # 1 / (sqrt(128) n): H's normalisation and the 1/n
        np.divide(_INV_SQRT_GROUP, norm, out=scale, where=norm > 0)
        y = hadamard(groups)
        y *= S2
        y *= scale[:, None]
        sign = (y < 0).view(np.uint8)
        a = np.abs(y, out=y)
        mag = np.zeros(a.shape, np.uint8)
        above = np.empty(a.shape, np.bool_)
        for t in self._thresholds:  # K-1 midpoints: 7, 3 or 1 vectorised passes
            np.greater(a, t, out=above)
            mag += above.view(np.uint8)
        payload = self._pack(sign, mag)
        centroid_norm = np.sqrt(self._centroid_norm2(payload))
        stored = norm / centroid_norm
        bad = ~(stored <= FP16_MAX)  # also catches inf from squaring huge fp32 values
        if bad.any():
            first = int(np.argmax(bad))  # groups are row-major: row * g + group
            raise self._overflow(x, first // g, first % g, float(centroid_norm[first]))
        return interleave_blocks(
            stored.astype(F16_LE).reshape(n, g), payload.reshape(n, g, self._payload)
        )

    def _overflow(self, x: F32Array, row: int, group: int, centroid_norm: float) -> CodecValueError:
        """The error for the first group whose stored norm does not fit fp16. What
        overflows is that stored value, ``group norm / ||C[idx]||``, so the message
        names it; the group norm is recomputed in fp64 so it is finite even when the
        fp32 squares overflowed."""
        values = x[row, group * GROUP : (group + 1) * GROUP].astype(np.float64)
        value = math.sqrt(float(np.dot(values, values))) / centroid_norm
        head, what = f"stored norm {value:g} of group {group}", f"the fp16 norm of {self.name}"
        return CodecValueError(
            f"{head} at row {row} overflows {what}", row, f"{head} overflows {what}"
        )

    def _decode(self, data: U8Array, dim: int) -> F32Array:
        n = data.shape[0]
        g = blocks_of(dim, GROUP)
        norm, payload = split_blocks(data, g, self._payload)
        v = self._values(np.ascontiguousarray(payload).reshape(n * g, self._payload))
        v *= norm.reshape(n * g, 1)
        out = hadamard(v)
        out *= _S1_SCALED
        # A zero group comes out as a mix of +0.0 and -0.0; adding +0.0 makes every zero
        # +0.0, so a never-written (all-zero) row decodes to all-zero fp32 bytes.
        out += np.float32(0)
        out = out.reshape(n, g * GROUP)
        return out if dim == g * GROUP else np.ascontiguousarray(out[:, :dim])


_BYTES = np.arange(256)
_S2_NEG: U8Array = (S2 < 0).astype(np.uint8)


def _s2_sign_bits(bits: int) -> U8Array:
    """Per position, the b-bit code's sign bit where s2 = -1 (XOR applies D(s2))."""
    return (_S2_NEG * np.uint8(1 << (bits - 1))).astype(np.uint8)


class Turbo4Codec(_TurboCodec):
    name: ClassVar[str] = "turbo4"
    format_id: ClassVar[int] = 2
    bits: ClassVar[int] = 4

    def __init__(self) -> None:
        super().__init__()
        lo, hi = _BYTES & 15, _BYTES >> 4
        self._byte_c2 = (self._c2[lo & 7] + self._c2[hi & 7]).astype(np.float32)
        self._tables = self._compiled_tables(self._byte_c2)
        # Byte -> its two values; the uint64 view moves both in one gather.
        pair = np.array(
            [[self._value(int(a)), self._value(int(b))] for a, b in zip(lo, hi, strict=True)]
        )
        self._byte_values = np.ascontiguousarray(pair, np.float32).view(np.uint64)[:, 0]
        # D(s2) on decode = flipping the sign bit (bit 3 of each nibble) where s2 = -1.
        self._flip = pack4(_s2_sign_bits(4))

    def _pack(self, sign: U8Array, mag: U8Array) -> U8Array:
        return pack4((sign << np.uint8(3)) | mag)

    def _centroid_norm2(self, payload: U8Array) -> F32Array:
        return halving_sum(self._byte_c2[payload])

    def _values(self, payload: U8Array) -> F32Array:
        pairs = self._byte_values[payload ^ self._flip]
        out: F32Array = pairs.view(np.float32).reshape(payload.shape[0], GROUP)
        return out


class Turbo3Codec(_TurboCodec):
    name: ClassVar[str] = "turbo3"
    format_id: ClassVar[int] = 3
    bits: ClassVar[int] = 3

    def __init__(self) -> None:
        super().__init__()
        crumbs = [(_BYTES >> (2 * k)) & 3 for k in range(4)]  # 2-bit fields, low first
        self._byte_c2 = sum(self._c2[c] for c in crumbs).astype(np.float32)
        self._tables = self._compiled_tables(self._byte_c2)
        quad = np.stack([self._centroids[c] for c in crumbs], axis=1).astype(np.float32)
        self._byte_mags = np.ascontiguousarray(quad).view(np.complex128)[:, 0]  # 16 B each
        bits = (_BYTES[:, None] >> np.arange(8)) & 1
        self._sign_masks = (bits.astype(np.uint32) << 31).astype(np.uint32)  # fp32 sign bits
        self._flip = np.packbits(_S2_NEG, bitorder="little")

    def _pack(self, sign: U8Array, mag: U8Array) -> U8Array:
        return np.concatenate([pack2(mag), np.packbits(sign, axis=1, bitorder="little")], axis=1)

    def _centroid_norm2(self, payload: U8Array) -> F32Array:
        return halving_sum(self._byte_c2[payload[:, : GROUP // 4]])

    def _values(self, payload: U8Array) -> F32Array:
        m = payload.shape[0]
        v: F32Array = self._byte_mags[payload[:, : GROUP // 4]].view(np.float32).reshape(m, GROUP)
        signs = self._sign_masks[payload[:, GROUP // 4 :] ^ self._flip].reshape(m, GROUP)
        v.view(np.uint32)[...] ^= signs
        return v


class Turbo2Codec(_TurboCodec):
    name: ClassVar[str] = "turbo2"
    format_id: ClassVar[int] = 4
    bits: ClassVar[int] = 2

    def __init__(self) -> None:
        super().__init__()
        crumbs = [(_BYTES >> (2 * k)) & 3 for k in range(4)]  # 2-bit codes, low first
        self._byte_c2 = sum(self._c2[c & 1] for c in crumbs).astype(np.float32)
        self._tables = self._compiled_tables(self._byte_c2)
        quad = np.array([[self._value(int(c[b])) for c in crumbs] for b in range(256)])
        self._byte_values = np.ascontiguousarray(quad, np.float32).view(np.complex128)[:, 0]
        self._flip = pack2(_s2_sign_bits(2))

    def _pack(self, sign: U8Array, mag: U8Array) -> U8Array:
        return pack2((sign << np.uint8(1)) | mag)

    def _centroid_norm2(self, payload: U8Array) -> F32Array:
        return halving_sum(self._byte_c2[payload])

    def _values(self, payload: U8Array) -> F32Array:
        quads = self._byte_values[payload ^ self._flip]
        out: F32Array = quads.view(np.float32).reshape(payload.shape[0], GROUP)
        return out
