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
8     bf16_rope  ``pion.codecs.bf16rope`` (bf16 rope +        1.12 (rope 64)
      _fp8_body  fp8 body; SCHEMA only, parameter ``rope``)
====  =========  ==========================================  ===============

``FORMAT_NAMES`` are the seven formats a whole session can use (``V.CREATE ...
VQUANT``, ``KV.PREFIX.REGISTER``); their order is the order of Pion's error texts.
``SCHEMA_ONLY_FORMATS`` need a per-layer parameter and exist only in a SCHEMA spec:
``bf16_rope_fp8_body`` needs ``rope``. A parametrized codec is one instance per
parameter value, made on first use and kept (at most ``MAX_DIM`` of them).

Lookups raise ``KeyError`` for an unknown name or id (callers word their own error,
e.g. ``unknown vquant``) and ``CodecError`` for a parameter that does not fit the
format (missing, out of range, or given to a format without one).
"""

from __future__ import annotations

from types import MappingProxyType

from pion.codecs.base import Codec
from pion.codecs.bf16rope import Bf16RopeFp8Codec
from pion.codecs.fp8 import Fp8Codec
from pion.codecs.fp16 import Fp16Codec
from pion.codecs.int8 import Int8Codec
from pion.codecs.mlx4 import Mlx4G32Codec
from pion.codecs.turbo import Turbo2Codec, Turbo3Codec, Turbo4Codec
from pion.errors import CodecError

__all__ = [
    "ALL_FORMAT_NAMES",
    "CODECS",
    "FORMAT_NAMES",
    "SCHEMA_ONLY_FORMATS",
    "codec_by_id",
    "format_id_of",
    "format_name",
    "get_codec",
]

# The order clients see in error texts ("want int8|turbo4|...", as Pion words them).
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

# Formats whose layers carry a parameter, so they exist only in a SCHEMA spec.
SCHEMA_ONLY_FORMATS: tuple[str, ...] = (Bf16RopeFp8Codec.name,)
ALL_FORMAT_NAMES: tuple[str, ...] = FORMAT_NAMES + SCHEMA_ONLY_FORMATS
_ID_OF = MappingProxyType(
    {**{c.name: c.format_id for c in _ALL}, Bf16RopeFp8Codec.name: Bf16RopeFp8Codec.format_id}
)
_NAME_OF = MappingProxyType({v: k for k, v in _ID_OF.items()})
if len(_NAME_OF) != len(_ID_OF) or 0 in _NAME_OF:
    raise RuntimeError("pion.codecs registry is inconsistent")
_ROPE_CODECS: dict[int, Bf16RopeFp8Codec] = {}


def get_codec(name: str, rope: int = 0) -> Codec:
    """The codec called ``name`` (case-sensitive, as in ALL_FORMAT_NAMES), with its
    parameter for a SCHEMA-only format; KeyError if no such format, CodecError if
    ``rope`` does not fit it."""
    plain = CODECS.get(name)
    if plain is not None:
        if rope:
            raise CodecError(f"format {name} takes no rope (got {rope})")
        return plain
    if name != Bf16RopeFp8Codec.name:
        raise KeyError(name)
    codec = _ROPE_CODECS.get(rope)
    if codec is None:
        codec = Bf16RopeFp8Codec(rope)  # validates rope before it is cached
        _ROPE_CODECS[codec.rope] = codec
    return codec


def codec_by_id(format_id: int, rope: int = 0) -> Codec:
    """The codec with on-disk id ``format_id`` (and parameter ``rope``); KeyError if
    no such id, CodecError if ``rope`` does not fit the format."""
    return get_codec(format_name(format_id), rope)


def format_name(format_id: int) -> str:
    """The name of on-disk id ``format_id``; KeyError if none."""
    return _NAME_OF[format_id]


def format_id_of(name: str) -> int:
    """The on-disk id of format ``name``; KeyError if none."""
    return _ID_OF[name]
