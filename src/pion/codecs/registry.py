"""The frozen table of storage formats: name <-> on-disk id <-> codec instance.

Format ids are written into snapshots, WAL records and blob headers as one unsigned
byte. They are frozen: an id is never reused or renumbered, even if a format is
retired (retire it by leaving its id unassigned forever). 0 is reserved as "no format"
so that a zeroed header byte can never be read as a real format.

====  =========  ==========================================  ===============
id    name       module                                      B/elem @ 1024
====  =========  ==========================================  ===============
0     (none)     reserved, never assigned
1     int8       ``pion.codecs.int8`` (llama.cpp q8_0)        1.0625
2     turbo4     ``pion.codecs.turbo``                        0.515625
3     turbo3     ``pion.codecs.turbo``                        0.390625
4     turbo2     ``pion.codecs.turbo``                        0.265625
5     fp16       ``pion.codecs.fp16``                         2.0
6     fp8        ``pion.codecs.fp8`` (E4M3FN, 32-block)       1.0625
7     mlx4g32    ``pion.codecs.mlx4`` (MLX affine int4 g32)   0.625
====  =========  ==========================================  ===============

Lookups raise ``KeyError``; callers word their own error (e.g. ``unknown vquant``).
"""

from __future__ import annotations

from types import MappingProxyType

from pion.codecs.base import Codec
from pion.codecs.fp8 import Fp8Codec
from pion.codecs.fp16 import Fp16Codec
from pion.codecs.int8 import Int8Codec
from pion.codecs.mlx4 import Mlx4G32Codec
from pion.codecs.turbo import Turbo2Codec, Turbo3Codec, Turbo4Codec

__all__ = ["CODECS", "FORMAT_NAMES", "codec_by_id", "get_codec"]

# The order clients see in error texts ("want int8|turbo4|...", DESIGN section 4.3).
FORMAT_NAMES: tuple[str, ...] = ("int8", "turbo4", "turbo3", "turbo2", "fp16", "fp8", "mlx4g32")

_ALL: tuple[Codec, ...] = (
    Int8Codec(),
    Turbo4Codec(),
    Turbo3Codec(),
    Turbo2Codec(),
    Fp16Codec(),
    Fp8Codec(),
    Mlx4G32Codec(),
)

CODECS = MappingProxyType({c.name: c for c in _ALL})
_BY_ID = MappingProxyType({c.format_id: c for c in _ALL})

# Import-time guards (not asserts): a duplicate id or a name missing from FORMAT_NAMES
# would silently corrupt stored data, so fail loudly at import instead.
if len(_BY_ID) != len(_ALL) or tuple(CODECS) != FORMAT_NAMES or 0 in _BY_ID:
    raise RuntimeError("pion.codecs registry is inconsistent")


def get_codec(name: str) -> Codec:
    """The codec called ``name`` (case-sensitive, as in FORMAT_NAMES); KeyError if none."""
    return CODECS[name]


def codec_by_id(format_id: int) -> Codec:
    """The codec with on-disk id ``format_id``; KeyError if none."""
    return _BY_ID[format_id]
