"""bf16_rope_fp8_body: a bf16 rotary part and an fp8 body per row (format id 8).

For keys with a decoupled rotary part (DeepSeek-style MLA: a small RoPE slice beside a
large compressed "nope" body), where the rotary values need more precision than the
body. A layer of this format has a parameter, ``rope`` (``1 <= rope < dim``), fixed
when the layer is created (``V.CREATE ... SCHEMA ... fmt=bf16_rope_fp8_body,dim=D,rope=R``)
and recorded with the layout; there is no uniform (``VQUANT``) form.

Row layout for dim ``d`` and rope ``r`` (``2*r + 34*ceil((d - r) / 32)`` bytes)::

    offset 2*i   value i as little-endian bfloat16, i = 0 .. r-1
    offset 2*r   the other d - r values in exactly the fp8 format's row layout
                 (pion.codecs.fp8): ceil((d - r) / 32) blocks of
                 [fp16 scale][32 E4M3FN codes], the last block zero-padded

This is Pion's layout (``[rope x BF16][body blocks x (FP16 scale + 32 x E4M3)]``) with
our fp8 body: scale ``amax / 448`` from the stored fp16 scale, saturating, and a body
whose width is not a multiple of 32 is padded rather than refused (Pion refuses it).

bfloat16 is the upper half of an IEEE fp32, rounded to nearest even (as ml_dtypes and
torch cast). Every finite fp32 value has a bf16 neighbour except the top of the range:
a value with ``|x| >= 0x7F7F8000`` (about 3.3961e38) would round to infinity and is
refused, naming the row. Decoding a bf16 value is exact (shift it back up 16 bits).

Error: the rope part keeps 8 significant bits (relative error at most 2**-8 per value;
rel. MSE 2.7e-6 measured on N(0, 1) rows); the body is fp8's. Measured at dim 1024,
rope 64 on N(0, 1) rows: 5.4e-4 overall (tests bound it at fp8's 1.2e-3, and the rope
part at 5e-6). Stored size at
dim 1024, rope 64: 128 + 30 * 34 = 1148 bytes (1.12 B/value); dim 512, rope 64 (Pion's
example): 128 + 14 * 34 = 604 bytes.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt

from pion.codecs.base import (
    MAX_DIM,
    Codec,
    CodecValueError,
    F32Array,
    U8Array,
    blocks_of,
    check_dim,
    first_bad_row,
)
from pion.codecs.fp8 import BLOCK, Fp8Codec
from pion.errors import CodecError

__all__ = ["BF16_OVERFLOW_BITS", "Bf16RopeFp8Codec", "from_bf16", "to_bf16"]

# The smallest fp32 magnitude (as bits) that rounds to bfloat16 infinity: 0x7F7F8000 is
# the tie between bf16's largest finite value 0x7F7F and 0x7F80 (inf), and ties go to
# the even one, 0x7F80.
BF16_OVERFLOW_BITS = 0x7F7F8000
U16Array = npt.NDArray[np.uint16]
# The body is stored by the fp8 codec itself, so both formats share one definition.
_BODY = Fp8Codec()
# Input bytes per slice of the compiled path (its scratch rows and temporaries).
_SLICE_BYTES = 256 << 10


def to_bf16(x: F32Array) -> U16Array:
    """bfloat16 bits (``<u2``) of finite fp32 values below the overflow threshold:
    the upper 16 bits, rounded to nearest even (what ``x.astype(ml_dtypes.bfloat16)``
    gives; tests/codecs/test_bf16rope.py checks it bit for bit)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    r = u + np.uint32(0x7FFF)
    r += (u >> 16) & np.uint32(1)
    out: U16Array = (r >> 16).astype("<u2")
    return out


def from_bf16(bits: U16Array) -> F32Array:
    """Exact fp32 values of bfloat16 bits."""
    out: F32Array = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out


class Bf16RopeFp8Codec(Codec):
    """One instance per ``rope`` value (``pion.codecs.get_codec(name, rope)`` caches
    them); ``row_bytes``/``encode``/``decode`` accept any ``dim`` in ``rope+1 .. 8192``."""

    name: ClassVar[str] = "bf16_rope_fp8_body"
    format_id: ClassVar[int] = 8

    def __init__(self, rope: int) -> None:
        if isinstance(rope, bool) or not isinstance(rope, int | np.integer):
            raise CodecError(f"rope must be an integer, got {type(rope).__name__}")
        if not 1 <= rope < MAX_DIM:
            raise CodecError(f"rope {rope} out of range 1..{MAX_DIM - 1}")
        self._rope = int(rope)

    @property
    def rope(self) -> int:
        return self._rope

    def _check(self, dim: int) -> None:
        check_dim(dim)
        if dim <= self._rope:
            raise CodecError(f"{self.name} with rope {self._rope} needs dim > rope, got dim {dim}")

    def row_bytes(self, dim: int) -> int:
        self._check(dim)
        return 2 * self._rope + blocks_of(dim - self._rope, BLOCK) * (2 + BLOCK)

    # The body goes through fp8's compiled twin when it is built, in row slices of at
    # most _SLICE_BYTES of input (the body of a row is not contiguous in either array),
    # which also bounds the bf16 part's temporaries.
    compiled: ClassVar[bool] = _BODY.compiled

    def _encode_into(self, x: F32Array, out: U8Array) -> bool:
        n, dim = x.shape
        self._check(dim)
        r = self._rope
        step = max(1, _SLICE_BYTES // (4 * dim))
        scratch = np.empty((min(step, n), out.shape[1] - 2 * r), np.uint8)
        for lo in range(0, n, step):
            head = x[lo : lo + step, :r]
            if (np.abs(head).view(np.uint32) >= np.uint32(BF16_OVERFLOW_BITS)).any():
                return False  # inf, NaN or a bf16 overflow: the reference raises
            rows = head.shape[0]
            out[lo : lo + step, : 2 * r] = to_bf16(head).view(np.uint8).reshape(rows, 2 * r)
            body = np.ascontiguousarray(x[lo : lo + step, r:])
            encoded = scratch[:rows]
            if not _BODY._encode_into(body, encoded):
                return False
            out[lo : lo + step, 2 * r :] = encoded
        return True

    def _decode_into(self, data: U8Array, dim: int, out: F32Array) -> bool:
        self._check(dim)
        n = data.shape[0]
        r = self._rope
        out[:, :r] = from_bf16(np.ascontiguousarray(data[:, : 2 * r]).view("<u2"))
        step = max(1, _SLICE_BYTES // (4 * dim))
        scratch = np.empty((min(step, n), dim - r), np.float32)
        for lo in range(0, n, step):
            body = np.ascontiguousarray(data[lo : lo + step, 2 * r :])
            decoded = scratch[: body.shape[0]]
            if not _BODY._decode_into(body, dim - r, decoded):
                return False
            out[lo : lo + step, r:] = decoded
        return True

    def _encode(self, x: F32Array, row_max: F32Array) -> U8Array:
        n, dim = x.shape
        self._check(dim)
        r = self._rope
        head = x[:, :r]
        over = np.abs(head).view(np.uint32) >= np.uint32(BF16_OVERFLOW_BITS)
        if over.any():
            row = first_bad_row(over)
            value = float(np.abs(head[row]).max())
            raise CodecValueError.overflow(value, row, "bf16")
        out = np.empty((n, self.row_bytes(dim)), np.uint8)
        out[:, : 2 * r] = to_bf16(head).view(np.uint8).reshape(n, 2 * r)
        # Finiteness was checked for the whole row; the body goes through fp8's own
        # encode (its scale overflow check names the same row).
        out[:, 2 * r :] = _BODY.encode(x[:, r:])
        return out

    def _decode(self, data: U8Array, dim: int) -> F32Array:
        self._check(dim)
        n = data.shape[0]
        r = self._rope
        out = np.empty((n, dim), np.float32)
        bits = np.ascontiguousarray(data[:, : 2 * r]).view("<u2")
        out[:, :r] = from_bf16(bits)
        out[:, r:] = _BODY.decode(data[:, 2 * r :], dim - r)
        return out

    def __repr__(self) -> str:
        return f"<codec {self.name} id={self.format_id} rope={self._rope}>"
