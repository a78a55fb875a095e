"""Storage formats for K/V rows: encode/decode with frozen on-disk ids.

Eight formats, one module per family (the reading order)::

    fp16.py    fp16      IEEE half, verbatim
    fp8.py     fp8       E4M3FN codes + fp16 scale per 32 values
    int8.py    int8      llama.cpp q8_0
    mlx4.py    mlx4g32   MLX affine int4, group 32 (bit-exact with mx.quantize)
    turbo.py   turbo4/3/2  rotated Lloyd-Max codes per 128 values
    bf16rope.py  bf16_rope_fp8_body  bf16 rotary prefix + fp8 body (SCHEMA only,
               one parameter: ``rope``)
    base.py    the Codec base class, CodecValueError, shared helpers
    registry.py  name/id table (ids are frozen; see its docstring)
    compiled.py  the compiled twins of the block codecs (_quant.c), when built

Each module's numpy code is the reference. int8, fp8, mlx4g32 and turbo (and so
bf16_rope_fp8_body's body) also have a compiled twin in ``_quant.c``, and fp16's casts
one in ``_speedups.c``: same bytes, same fp32 bits, the GIL released; where no
compiler was there at install time, numpy runs.

Each module's docstring specifies its row layout byte by byte. Every codec maps fp32
rows ``[n, dim]`` (dim 1..8192) to ``uint8 [n, row_bytes(dim)]`` and back; block formats
pad with zeros internally, so any dim works and a requested format is never changed.
An all-zero stored row always decodes to zeros (the V-store zero-fills unwritten rows).

Errors: :class:`CodecValueError` (a :class:`pion.errors.CodecError`) for non-finite
input or a value beyond an fp16 field, with ``.row`` relative to the input;
``CodecError`` for a bad shape or a buffer that is not a whole number of rows.

This package imports nothing else from ``pion`` except ``pion.errors``.
"""

from __future__ import annotations

from pion.codecs.base import MAX_DIM, Codec, CodecValueError
from pion.codecs.registry import (
    ALL_FORMAT_NAMES,
    FORMAT_NAMES,
    SCHEMA_ONLY_FORMATS,
    codec_by_id,
    format_id_of,
    format_name,
    get_codec,
)

__all__ = [
    "ALL_FORMAT_NAMES",
    "FORMAT_NAMES",
    "MAX_DIM",
    "SCHEMA_ONLY_FORMATS",
    "Codec",
    "CodecValueError",
    "codec_by_id",
    "format_id_of",
    "format_name",
    "get_codec",
]
