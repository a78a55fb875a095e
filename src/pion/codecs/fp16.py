"""fp16: IEEE binary16, verbatim (format id 5).

Row layout for dim ``d`` (``2*d`` bytes)::

    offset 2*i   value i as little-endian IEEE binary16, i = 0 .. d-1

Encoding is exactly numpy's ``float32 -> float16`` cast (round to nearest even). A value
with ``|x| > 65504`` is refused rather than stored as ``inf`` (or silently rounded down
to 65504 from just above it). This is also the layout of ``V.STOREBATCH ... FMT F16``
blobs, which the V-store keeps verbatim.

Both casts run through ``_speedups.c`` (F16C, 8 values per instruction) when it was
built and the CPU has F16C; that twin vouches for bit-identical results or declines,
and then numpy casts (``tests/codecs/test_fp16.py`` compares the two).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from pion.codecs.base import F16_LE, FP16_MAX, Codec, CodecValueError, F32Array, U8Array

__all__ = ["COMPILED", "Fp16Codec"]

# The compiled casts (module docstring): (source, destination) -> done?
_to_f16: Callable[[F32Array, np.ndarray], bool] | None
_from_f16: Callable[[np.ndarray, F32Array], bool] | None
if TYPE_CHECKING:
    _to_f16 = _from_f16 = None
else:
    try:
        from pion.codecs._speedups import from_f16 as _from_f16
        from pion.codecs._speedups import to_f16 as _to_f16
    except ImportError:  # no compiler at install time: numpy casts
        _to_f16 = _from_f16 = None
COMPILED = _to_f16 is not None

_F16_TO_F32: F32Array = np.arange(65536, dtype="<u2").view(F16_LE).astype(np.float32)
_F16_TO_F32.flags.writeable = False


class Fp16Codec(Codec):
    name: ClassVar[str] = "fp16"
    format_id: ClassVar[int] = 5

    def row_bytes(self, dim: int) -> int:
        return 2 * dim

    compiled: ClassVar[bool] = COMPILED

    def _encode_into(self, x: F32Array, out: U8Array) -> bool:
        # The range checks are numpy's reductions; a row they refuse goes the generic
        # way, which raises the exact error.
        hi = x.max(axis=1)
        lo = x.min(axis=1)
        if not (np.isfinite(hi).all() and np.isfinite(lo).all()):
            return False
        if max(float(hi.max()), -float(lo.min())) > FP16_MAX or _to_f16 is None:
            return False
        return bool(_to_f16(x, out.view("<u2")))

    def _decode_into(self, data: U8Array, dim: int, out: F32Array) -> bool:
        return _from_f16 is not None and bool(_from_f16(data.view("<u2"), out))

    def _encode(self, x: F32Array, row_max: F32Array) -> U8Array:
        over = row_max > FP16_MAX
        if over.any():
            row = int(np.argmax(over))
            raise CodecValueError.overflow(float(row_max[row]), row, "fp16")
        if _to_f16 is not None:
            out = np.empty(x.shape, dtype="<u2")
            if _to_f16(x, out):
                return out.view(np.uint8)
        return x.astype(F16_LE).view(np.uint8)

    def _decode(self, data: U8Array, dim: int) -> F32Array:
        bits = data.view("<u2")
        if _from_f16 is not None:
            out = np.empty(bits.shape, dtype=np.float32)
            if _from_f16(bits, out):
                return out
        # A 256 KiB table of every half's fp32 value (numpy's own cast, so bit-identical)
        # indexed by the stored bits: about 1.6x faster than the cast on this machine,
        # where numpy's fp16 casts are not vectorised.
        decoded: F32Array = _F16_TO_F32[bits]
        return decoded
