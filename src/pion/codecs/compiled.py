"""The compiled twins of the block codecs (``_quant.c``: int8, fp8, mlx4g32, turbo), or
``None`` where the package was installed without a C compiler (the numpy references
run then). Each codec module calls into it through ``Codec._encode_into`` and
``Codec._decode_into``; ``tests/codecs/test_compiled.py`` holds the two to the same
bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["COMPILED", "quant"]

quant: Any
if TYPE_CHECKING:
    quant = None
else:
    try:
        from pion.codecs import _quant as quant
    except ImportError:  # no compiler at install time: numpy only
        quant = None
COMPILED = quant is not None
