"""fp16 -> fp32 widening of a key block, for slots that hold fp16 rows (``KV.PREFIX.WARM``
of an fp16 layer keeps the V-store's rows; ``pion.attend.warm``).

A block of such a slot is a ``[G, C, D]`` view of token-major rows, so its ``[C, G, D]``
transpose is one contiguous run of memory: the fp16 codec's compiled F16C cast widens
it in one call (8 values per instruction, exact: every half is an fp32). Anything else
(a gathered or sliced block, no compiled twin, a CPU without F16C) is numpy's cast,
also exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

__all__ = ["COMPILED", "widen"]

F32 = npt.NDArray[np.float32]

_from_f16: Callable[[np.ndarray, F32], bool] | None
if TYPE_CHECKING:
    _from_f16 = None
else:
    try:
        from pion.codecs._speedups import from_f16 as _from_f16
    except ImportError:  # no compiler at install time: numpy casts
        _from_f16 = None
COMPILED = _from_f16 is not None


def widen(block: npt.NDArray[np.float32] | npt.NDArray[np.float16]) -> F32:
    """``block`` as fp32: itself when it is fp32, else a fresh widened copy."""
    if block.dtype == np.float32:
        return block  # type: ignore[return-value]
    if _from_f16 is not None and block.ndim == 3:
        rows = block.transpose(1, 0, 2)
        if rows.flags.c_contiguous:
            out = np.empty(rows.shape, dtype=np.float32)
            if _from_f16(rows.view(np.uint16), out):
                return out.transpose(1, 0, 2)
    return block.astype(np.float32)
