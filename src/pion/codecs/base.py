"""The codec interface, its error type and the helpers every storage format shares.

A codec turns rows of fp32 values ``[n, dim]`` into a fixed number of bytes per row and
back. This module owns what all seven formats have in common:

* :class:`Codec`, the abstract base. Its public :meth:`Codec.encode` and
  :meth:`Codec.decode` validate input once (shape, dim range, finiteness, buffer
  length) and hand a C-contiguous array to the format's ``_encode``/``_decode``.
* :class:`CodecValueError`, raised for a value a format cannot hold. It carries the
  offending row *relative to the input*; the V-store adds the layer and absolute row.
* The fp16 range rule. Every fp16 field (fp16 values, block scales, biases, turbo norms)
  refuses a magnitude above ``FP16_MAX`` (65504) *before* casting, so nothing is ever
  silently stored as ``inf`` (numpy would round values below 65520 down to 65504 and
  turn the rest into ``inf``; we refuse both, one rule for every field).
* Block (de)interleaving for the ``[fp16 field][payload]`` block layouts of int8, fp8
  and the turbo formats, and 4-bit / 2-bit packing.

It does not own the format-id table (``registry``) or any format's arithmetic.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from pion.errors import CodecError

__all__ = [
    "F16_LE",
    "FP16_MAX",
    "MAX_DIM",
    "Buffer",
    "Codec",
    "CodecValueError",
    "F32Array",
    "U8Array",
    "blocks_of",
    "check_dim",
    "check_fp16_range",
    "first_bad_row",
    "interleave_blocks",
    "pack2",
    "pack4",
    "round_to_fp16",
    "split_blocks",
    "unpack2",
    "unpack4",
]

# Pion's bound: a layer's dim is 1..8192 (V.CREATE / SCHEMA refuse anything else).
MAX_DIM = 8192
# Largest finite IEEE binary16 value.
FP16_MAX = 65504.0
# Every multi-byte field on disk is little-endian, whatever the host.
F16_LE = np.dtype("<f2")

F32Array = npt.NDArray[np.float32]
U8Array = npt.NDArray[np.uint8]
# What decode accepts: a uint8 array or any bytes-like object (no copy is made of it).
Buffer = np.ndarray | bytes | bytearray | memoryview


class CodecValueError(CodecError):
    """A row holds a value its format cannot store (non-finite, or beyond an fp16 field).

    ``row`` is the index within the rows passed to ``encode``; ``detail`` is the message
    without the row, for callers that name the layer and absolute row themselves.
    """

    def __init__(self, message: str, row: int, detail: str) -> None:
        super().__init__(message)
        self.row = row
        self.detail = detail

    @classmethod
    def non_finite(cls, row: int) -> CodecValueError:
        return cls(f"non-finite value at row {row}", row, "non-finite value")

    @classmethod
    def overflow(cls, value: float, row: int, what: str, label: str = "value") -> CodecValueError:
        """``value 1e+06 at row 2 overflows fp16``; ``what`` names the field."""
        head = f"{label} {value:g}"
        return cls(f"{head} at row {row} overflows {what}", row, f"{head} overflows {what}")


def first_bad_row(bad: npt.NDArray[np.bool_]) -> int:
    """Index of the first row with any ``True`` in ``bad`` (shape ``[n, ...]``)."""
    per_row = bad.reshape(bad.shape[0], -1).any(axis=1)
    return int(np.argmax(per_row))


def blocks_of(dim: int, block: int) -> int:
    """Number of ``block``-sized blocks that hold ``dim`` values (zero padding at the end)."""
    return -(-dim // block)


def as_blocks(x: F32Array, block: int) -> F32Array:
    """``x [n, dim]`` as ``[n, nb, block]``, the last block zero-padded (a view when
    ``dim`` is a multiple of ``block``, else one padded copy)."""
    n, dim = x.shape
    nb = blocks_of(dim, block)
    if dim % block:
        padded = np.zeros((n, nb * block), np.float32)
        padded[:, :dim] = x
        x = padded
    return x.reshape(n, nb, block)


def from_blocks(blocks: F32Array, dim: int) -> F32Array:
    """Inverse of :func:`as_blocks`: ``[n, nb, block]`` to C-contiguous ``[n, dim]``."""
    n, nb, block = blocks.shape
    flat = blocks.reshape(n, nb * block)
    return flat if dim == nb * block else np.ascontiguousarray(flat[:, :dim])


def check_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer):
        raise CodecError(f"dim must be an integer, got {type(dim).__name__}")
    if not 1 <= dim <= MAX_DIM:
        raise CodecError(f"dim {dim} out of range 1..{MAX_DIM}")


class Codec(abc.ABC):
    """One storage format: fp32 rows ``[n, dim]`` <-> ``row_bytes(dim)`` bytes per row.

    Contract (tested for every format by ``tests/codecs/test_contract.py``):
    deterministic bytes; an all-zero stored row decodes to exact zeros; an all-zero
    input row encodes to bytes that decode to zeros; non-finite input and truncated
    buffers are refused; every dim in 1..8192 works.
    """

    name: ClassVar[str]
    format_id: ClassVar[int]
    # True where _encode_into/_decode_into have a compiled twin to call.
    compiled: ClassVar[bool] = False

    @property
    def rope(self) -> int:
        """The layout parameter of a parametrized format (``bf16_rope_fp8_body``'s
        bf16 prefix length); 0 for every format without one."""
        return 0

    @abc.abstractmethod
    def row_bytes(self, dim: int) -> int:
        """Bytes per stored row for a row of ``dim`` values."""

    @abc.abstractmethod
    def _encode(self, x: F32Array, row_max: F32Array) -> U8Array:
        """Encode finite, C-contiguous ``x [n, dim]``; ``row_max`` is ``max|x|`` per row."""

    @abc.abstractmethod
    def _decode(self, data: U8Array, dim: int) -> F32Array:
        """Decode ``data [n, row_bytes(dim)]`` to a new C-contiguous ``[n, dim]`` array."""

    def _encode_into(self, x: F32Array, out: U8Array) -> bool:
        """The compiled twin (``_quant.c``): encode C-contiguous fp32 ``x`` into
        ``out``, checking finiteness and ranges itself; False (``out`` garbage) when it
        declines or is not built, and then the numpy reference runs."""
        return False

    def _decode_into(self, data: U8Array, dim: int, out: F32Array) -> bool:
        """The compiled twin of decode into ``out``; False when it is not built."""
        return False

    def encode(self, rows: npt.ArrayLike, out: U8Array | None = None) -> U8Array:
        """Encode fp32 rows ``[n, dim]`` (any strides) to ``uint8 [n, row_bytes(dim)]``,
        into ``out`` when given (C-contiguous, that shape; its destination rows, so a
        store writes them once).

        Raises :class:`CodecValueError` for a non-finite value or one the format cannot
        hold, and :class:`CodecError` for a bad shape.
        """
        x = np.asarray(rows)
        if x.ndim != 2:
            raise CodecError(f"rows must be 2-D [n, dim], got shape {x.shape}")
        if x.dtype.kind != "f":
            raise CodecError(f"rows must be floating point, got {x.dtype}")
        check_dim(x.shape[1])
        shape = (x.shape[0], self.row_bytes(x.shape[1]))
        if out is not None and (
            out.dtype != np.uint8 or out.shape != shape or not out.flags.c_contiguous
        ):
            raise CodecError(f"out must be C-contiguous uint8 {list(shape)}")
        # One copy at most: a strided or non-fp32 input becomes C-contiguous fp32 here.
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape[0] == 0:
            return np.empty(shape, np.uint8) if out is None else out
        if self.compiled:
            target = np.empty(shape, np.uint8) if out is None else out
            if self._encode_into(x, target):
                return target
        # max and min propagate NaN and expose +-inf; two reductions, no temporaries.
        hi = x.max(axis=1)
        lo = x.min(axis=1)
        finite = np.isfinite(hi) & np.isfinite(lo)
        if not finite.all():
            row = int(np.argmin(finite))
            raise CodecValueError.non_finite(row)
        row_max = np.maximum(hi, -lo)
        encoded = self._encode(x, row_max)
        if out is None:
            return encoded
        out[...] = encoded
        return out

    def decode(self, data: Buffer, dim: int, out: F32Array | None = None) -> F32Array:
        """Decode ``uint8 [n, row_bytes(dim)]`` (or a flat buffer of n rows) to fp32,
        into ``out`` when given (C-contiguous fp32 ``[n, dim]``)."""
        check_dim(dim)
        rb = self.row_bytes(dim)
        buf = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
        if buf.dtype != np.uint8:
            raise CodecError(f"{self.name} data must be uint8, got {buf.dtype}")
        if buf.ndim == 2 and buf.shape[1] != rb:
            raise CodecError(
                f"{self.name} rows of dim {dim} are {rb} bytes, got rows of {buf.shape[1]}"
            )
        if buf.ndim not in (1, 2):
            raise CodecError(f"{self.name} data must be 1-D or 2-D, got shape {buf.shape}")
        if buf.size % rb:
            raise CodecError(
                f"truncated {self.name} buffer: {buf.size} bytes is not a multiple of "
                f"the {rb}-byte row of dim {dim}"
            )
        rows = np.ascontiguousarray(buf).reshape(-1, rb)
        shape = (rows.shape[0], dim)
        if out is not None and (
            out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous
        ):
            raise CodecError(f"out must be C-contiguous float32 {list(shape)}")
        if self.compiled and rows.shape[0]:
            target = np.empty(shape, np.float32) if out is None else out
            if self._decode_into(rows, dim, target):
                return target
        decoded = self._decode(rows, dim)
        if out is None:
            return decoded
        out[...] = decoded
        return out

    def __repr__(self) -> str:
        return f"<codec {self.name} id={self.format_id}>"


def check_fp16_range(field: F32Array, what: str, inputs: F32Array) -> None:
    """Refuse a field (``[n, nb]``, rows first) whose magnitude would exceed ``FP16_MAX``.

    ``what`` names the field ("the fp16 block scale of int8"). The error reports the
    largest input magnitude ``inputs`` (same shape, e.g. block amax) of the first
    offending row: the user's value, not the derived scale.
    """
    bad = np.abs(field) > FP16_MAX
    if bad.any():
        row = first_bad_row(bad)
        raise CodecValueError.overflow(float(np.abs(inputs[row]).max()), row, what)


def round_to_fp16(x: F32Array) -> F32Array:
    """``x.astype(float16).astype(float32)`` for ``|x| <= 65504``, without the fp16 array.

    Rounds the fp32 mantissa to nearest even at bit 13 (fp16 keeps 10 of fp32's 23
    mantissa bits); values below 2**-14 (fp16 subnormals) round to multiples of 2**-24.
    Bit-identical to numpy's two casts for every fp32 value in [-65504, 65504] (checked
    exhaustively when written, and on a dense sample by tests/codecs/test_base.py), and
    faster, because numpy's fp16 casts are not vectorised on every build.
    """
    u = x.view(np.uint32)
    mag = u & np.uint32(0x7FFFFFFF)
    r = mag + np.uint32(0xFFF)
    r += (mag >> 13) & np.uint32(1)
    r &= np.uint32(0xFFFFE000)
    r |= u & np.uint32(0x80000000)
    out = r.view(np.float32)
    sub = mag < np.uint32(0x38800000)  # 2**-14, the smallest normal fp16 value
    if sub.any():
        s = x[sub] * np.float32(2.0**24)
        np.rint(s, out=s)
        s *= np.float32(2.0**-24)
        out[sub] = s
    return out


def interleave_blocks(fields: npt.NDArray[np.float16], payload: U8Array) -> U8Array:
    """Lay out ``[n, nb]`` fp16 fields and ``[n, nb, P]`` payloads as ``[f16][P bytes]`` blocks.

    Returns ``uint8 [n, nb * (2 + P)]``. ``fields`` must already be little-endian fp16.
    """
    n, nb, p = payload.shape
    out = np.empty((n, nb, 2 + p), np.uint8)
    out[:, :, :2] = fields.reshape(n, nb, 1).view(np.uint8)
    out[:, :, 2:] = payload
    return out.reshape(n, nb * (2 + p))


def split_blocks(data: U8Array, nb: int, p: int) -> tuple[npt.NDArray[np.float32], U8Array]:
    """Inverse of :func:`interleave_blocks`: fp16 fields as fp32 ``[n, nb]``, payload view."""
    blocks = data.reshape(data.shape[0], nb, 2 + p)
    fields = np.ascontiguousarray(blocks[:, :, :2]).view(F16_LE)[:, :, 0].astype(np.float32)
    return fields, blocks[:, :, 2:]


def pack4(codes: U8Array) -> U8Array:
    """Pack 4-bit codes ``[..., 2k]`` into bytes ``[..., k]``, first code in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))


def unpack4(packed: U8Array) -> U8Array:
    """Inverse of :func:`pack4`."""
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), np.uint8)
    np.bitwise_and(packed, 0x0F, out=out[..., 0::2])
    np.right_shift(packed, 4, out=out[..., 1::2])
    return out


def pack2(codes: U8Array) -> U8Array:
    """Pack 2-bit codes ``[..., 4k]`` into bytes ``[..., k]``, first code in bits 0-1."""
    out: U8Array = (
        codes[..., 0::4]
        | (codes[..., 1::4] << np.uint8(2))
        | (codes[..., 2::4] << np.uint8(4))
        | (codes[..., 3::4] << np.uint8(6))
    )
    return out


def unpack2(packed: U8Array) -> U8Array:
    """Inverse of :func:`pack2`."""
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 4), np.uint8)
    for k in range(4):  # four bit-pairs per byte, each a vectorised pass
        np.bitwise_and(packed >> (2 * k), 0x03, out=out[..., k::4])
    return out
