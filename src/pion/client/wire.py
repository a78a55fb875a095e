"""Pure functions between numpy/Python values and Pion's wire: argument lists to send
and parsers for the replies (docs/protocol.md). No sockets here; :mod:`.plans` strings
these together into operations and :mod:`.cache` / :mod:`.aio` do the I/O.

Conventions this module owns:

* Namespaces are Pion's: ``sha256("|".join(parts))`` hex, first 32 characters; the
  K and V halves are the V-store sessions ``<ns>_pk`` and ``<ns>_pv``; the attention
  tier uses ``<ns>_attn`` (what Pion's client sends).
* A K/V layer travels as token-major rows ``[N, kv_dim]`` with ``kv_dim = H*D``,
  head-major within a row, little-endian fp32 (or fp16 with ``FMT F16``). A layer given
  as ``[H, N, D]`` is transposed to that layout here.
* Blobs are sent as ``memoryview`` casts of contiguous arrays, so a large layer is not
  copied into a ``bytes`` before it reaches the socket.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from pion.client.errors import PionProtocolError
from pion.wire import namespace_sids

__all__ = [
    "Arg",
    "Command",
    "Rows",
    "SessionLayout",
    "as_rows",
    "attend_sid",
    "decode_rows",
    "hash_array",
    "int_arg",
    "make_namespace",
    "parse_attend_reply",
    "parse_blocks",
    "parse_fields",
    "parse_hit",
    "parse_membership",
    "parse_session_layout",
    "parse_stats",
    "parse_warm",
    "query_shape",
    "session_ids",
    "text",
]

Arg: TypeAlias = str | bytes | int | memoryview
Command: TypeAlias = tuple[Arg, ...]
Rows: TypeAlias = npt.NDArray[np.float32] | npt.NDArray[np.float16]

_BLOCKS_HEADER = struct.Struct("<II")


def make_namespace(*parts: str) -> str:
    """Pion's namespace: sha256 of the UTF-8 of ``"|".join(parts)``, first 32 hex chars.

    Byte for byte what ``pion_vllm_mlx.PionPromptCache.make_namespace`` returns, so both
    clients address the same prefix. The join is Pion's contract and is ambiguous when a
    part itself contains ``|``: hash such parts (or use fixed-format ones) first.
    """
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def session_ids(ns: str) -> tuple[str, str]:
    """The V-store sessions holding a namespace's keys and values."""
    k, v = namespace_sids(ns.encode())
    return k.decode(), v.decode()


def attend_sid(ns: str) -> str:
    """The attention-tier session Pion's client uses for a namespace."""
    return f"{ns}_attn"


def text(reply: object) -> str:
    """A simple-string or bulk reply as text."""
    if isinstance(reply, bytes):
        return reply.decode("utf-8", "replace")
    if isinstance(reply, str):
        return reply
    raise PionProtocolError(f"expected a string reply, got {type(reply).__name__}")


# -- arrays --------------------------------------------------------------------------


def _is_float(dtype: np.dtype[Any]) -> bool:
    # bf16/fp8 from ml_dtypes are not numpy floating kinds but cast to fp32 exactly.
    return dtype.kind == "f" or dtype.name.startswith(("bfloat16", "float8"))


def as_rows(array: npt.ArrayLike, what: str) -> Rows:
    """One layer as contiguous little-endian rows ``[N, H*D]``: fp16 stays fp16 (the
    caller decides whether the wire may carry it), any other float becomes fp32.

    Accepts ``[H, N, D]`` (heads first, as attention implementations hold it) or
    ``[N, H*D]`` (Pion's row layout)."""
    a = np.asarray(array)
    if not _is_float(a.dtype):
        raise TypeError(f"{what}: expected a float array, got dtype {a.dtype}")
    if a.ndim == 3:
        h, n, d = a.shape
        a = a.transpose(1, 0, 2).reshape(n, h * d)
    elif a.ndim != 2:
        raise ValueError(f"{what}: expected [H, N, D] or [N, H*D], got shape {list(a.shape)}")
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"{what}: empty layer, shape {list(a.shape)}")
    if a.dtype == np.float16:
        return np.ascontiguousarray(a, dtype="<f2")
    return np.ascontiguousarray(a, dtype="<f4")


def decode_rows(reply: object, n: int, dim: int, what: str) -> npt.NDArray[np.float32]:
    """A fetched bulk of ``n`` rows of ``dim`` values as fp32 ``[n, dim]``.

    ``FMT NATIVE`` makes fp16 layers reply fp16 (half the bytes) and others fp32, so
    the width is read from the length, as Pion's client does. ``None`` (``$-1``: the
    layer holds no rows) reads as zeros, like rows never written. fp32 results are
    read-only views of the reply bytes."""
    if reply is None:
        return np.zeros((n, dim), dtype=np.float32)
    if not isinstance(reply, bytes | bytearray | memoryview):
        raise PionProtocolError(f"{what}: expected a bulk reply, got {type(reply).__name__}")
    size = len(reply)
    if size == n * dim * 4:
        return np.frombuffer(reply, dtype="<f4").reshape(n, dim)
    if size == n * dim * 2:
        return np.frombuffer(reply, dtype="<f2").reshape(n, dim).astype(np.float32)
    raise PionProtocolError(
        f"{what}: reply of {size} bytes is neither fp32 ({n * dim * 4}) nor fp16 "
        f"({n * dim * 2}) for {n} rows x {dim}"
    )


# -- replies -------------------------------------------------------------------------


def parse_hit(reply: object, what: str) -> bool:
    """``+HIT`` -> True, ``+MISS`` (or ``+COLD``) -> False."""
    word = text(reply)
    if word not in ("HIT", "MISS", "COLD"):
        raise PionProtocolError(f"{what}: unexpected reply {word[:40]!r}")
    return word == "HIT"


def _number(value: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def parse_fields(reply: object) -> dict[str, int | float | str]:
    """A bulk of ``name:value`` lines (KV.PREFIX.INFO, V.INFO), numbers converted."""
    out: dict[str, int | float | str] = {}
    for line in text(reply).splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name] = _number(value)
    return out


def parse_stats(reply: object) -> dict[str, int | float]:
    """PION.STATS: a flat RESP2 array of pairs or a RESP3 map. The two
    ``prefill_seconds_*`` fields arrive as ``S.mmm`` strings and become floats."""
    if isinstance(reply, Mapping):
        pairs = list(reply.items())
    elif isinstance(reply, list) and len(reply) % 2 == 0:
        pairs = list(zip(reply[::2], reply[1::2], strict=True))
    else:
        raise PionProtocolError("PION.STATS: expected pairs")
    out: dict[str, int | float] = {}
    for key, value in pairs:
        number = value if isinstance(value, int) else _number(text(value))
        if isinstance(number, str):
            raise PionProtocolError(f"PION.STATS: {text(key)} is not a number: {number!r}")
        out[text(key)] = number
    return out


def parse_blocks(reply: object) -> tuple[int, npt.NDArray[np.uint64]] | None:
    """KV.PREFIX.BLOCKS: ``(block_size, hashes)`` or None for ``+UNKNOWN``.

    A real table is at least 8 bytes, so the 7-byte ``UNKNOWN`` cannot be one."""
    if not isinstance(reply, bytes):
        raise PionProtocolError(f"KV.PREFIX.BLOCKS: unexpected {type(reply).__name__}")
    if reply == b"UNKNOWN":
        return None
    if len(reply) < _BLOCKS_HEADER.size:
        raise PionProtocolError(f"KV.PREFIX.BLOCKS: {len(reply)}-byte reply")
    block_size, count = _BLOCKS_HEADER.unpack_from(reply)
    if len(reply) != _BLOCKS_HEADER.size + 8 * count:
        raise PionProtocolError(f"KV.PREFIX.BLOCKS: {len(reply)} bytes for {count} hashes")
    hashes = np.frombuffer(reply, dtype="<u8", offset=_BLOCKS_HEADER.size).astype(np.uint64)
    return block_size, hashes


def parse_membership(reply: object, count: int) -> npt.NDArray[np.bool_] | None:
    """KV.PREFIX.MEMBERSHIP's bitmap (bit i = byte ``i>>3``, bit ``i&7``, LSB first)
    as ``count`` booleans; None for ``+UNKNOWN``.

    Through redis-py a status reply and a bulk are both ``bytes``, so a 7-byte bitmap
    (49..56 probes) equal to ``UNKNOWN`` would be ambiguous; the caller resolves that
    one case with KV.PREFIX.BLOCKS."""
    if not isinstance(reply, bytes):
        raise PionProtocolError(f"KV.PREFIX.MEMBERSHIP: unexpected {type(reply).__name__}")
    if reply == b"UNKNOWN" and (count + 7) // 8 != len(reply):
        return None
    if len(reply) != (count + 7) // 8:
        raise PionProtocolError(f"KV.PREFIX.MEMBERSHIP: {len(reply)} bytes for {count} probes")
    bits = np.unpackbits(np.frombuffer(reply, dtype=np.uint8), bitorder="little")
    return bits[:count].astype(bool)


def parse_warm(reply: object) -> tuple[int, int]:
    """KV.PREFIX.WARM's ``+<layers>`` or ``+<layers> skipped_dim=<k>``."""
    head, _, tail = text(reply).partition(" ")
    try:
        layers = int(head)
        skipped = int(tail.partition("=")[2]) if tail else 0
    except ValueError:
        raise PionProtocolError(f"KV.PREFIX.WARM: unexpected reply {text(reply)[:40]!r}") from None
    return layers, skipped


@dataclass(frozen=True)
class SessionLayout:
    """What V.INFO says about one V-store session: per-layer dim, format, row count."""

    default_dim: int
    default_fmt: str
    dims: Mapping[int, int]  # heterogeneous sessions only: layer -> kv_dim
    fmts: Mapping[int, str]  # heterogeneous sessions only: layer -> format
    tokens: Mapping[int, int]  # layer -> rows held (tpl), layers holding rows only
    # V.INFO's num_layers: what V.FETCH BATCH without a layer count answers (a SCHEMA
    # session's N, a uniform session's highest layer + 1); 0 when not reported.
    declared_layers: int = 0

    def dim(self, layer: int) -> int:
        return self.dims.get(layer, self.default_dim)

    def fmt(self, layer: int) -> str:
        return self.fmts.get(layer, self.default_fmt)

    @property
    def num_layers(self) -> int:
        """Layers ``0 .. L-1`` that a full fetch returns: up to the last one holding rows."""
        return max(self.tokens) + 1 if self.tokens else 0

    @property
    def max_tokens(self) -> int:
        return max(self.tokens.values(), default=0)


def parse_session_layout(reply: object) -> SessionLayout:
    """V.INFO <sid>: ``value_dim``/``v_format`` and, for heterogeneous sessions,
    ``layer_<i>_dim``/``layer_<i>_fmt``; ``layer_<i>_tokens`` for layers holding rows."""
    fields = parse_fields(reply)
    tokens: dict[int, int] = {}
    dims: dict[int, int] = {}
    fmts: dict[int, str] = {}
    for name, value in fields.items():
        parts = name.split("_")
        if len(parts) != 3 or parts[0] != "layer" or not parts[1].isdigit():
            continue
        layer = int(parts[1])
        if parts[2] == "fmt":
            fmts[layer] = str(value)
        elif parts[2] in ("tokens", "dim"):
            if not isinstance(value, int):
                raise PionProtocolError(f"V.INFO: {name} is not an integer")
            (tokens if parts[2] == "tokens" else dims)[layer] = value
    default_dim = fields.get("value_dim", 0)
    if not isinstance(default_dim, int):
        raise PionProtocolError("V.INFO: value_dim is not an integer")
    declared = fields.get("num_layers", 0)
    if not isinstance(declared, int):
        raise PionProtocolError("V.INFO: num_layers is not an integer")
    fmt = str(fields.get("v_format", ""))
    return SessionLayout(default_dim, fmt, dims, fmts, tokens, declared)


# -- attention tier ------------------------------------------------------------------


def query_shape(q: npt.NDArray[Any]) -> tuple[int, int, int]:
    """``(H, M, D)`` of an attention query given as ``[H, D]`` (M=1) or ``[H, M, D]``."""
    if q.ndim == 2:
        return int(q.shape[0]), 1, int(q.shape[1])
    if q.ndim == 3:
        return int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    raise ValueError(f"query must be [H, D] or [H, M, D], got shape {list(q.shape)}")


def parse_attend_reply(
    reply: object, h: int, m: int, d: int, *, squeeze: bool
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32] | None]:
    """ATTEND.PREFIX.QUERY: ``[H, D]`` for M=1 (``squeeze``), else ``[H, M, D]`` then
    the LSE trailer ``[H, M]`` (logsumexp of the scaled scores)."""
    if not isinstance(reply, bytes):
        raise PionProtocolError(f"ATTEND.PREFIX.QUERY: unexpected {type(reply).__name__}")
    out_bytes = h * m * d * 4
    lse_bytes = h * m * 4 if not squeeze else 0
    if len(reply) != out_bytes + lse_bytes:
        raise PionProtocolError(
            f"ATTEND.PREFIX.QUERY: {len(reply)} bytes, want {out_bytes + lse_bytes}"
        )
    out = np.frombuffer(reply, dtype="<f4", count=h * m * d)
    if squeeze:
        return out.reshape(h, d), None
    lse = np.frombuffer(reply, dtype="<f4", offset=out_bytes).reshape(h, m)
    return out.reshape(h, m, d), lse


def int_arg(value: int, what: str) -> int:
    """An integer argument, refusing bools and negatives before they reach the wire."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return int(value)


def hash_array(hashes: Sequence[int] | npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """Block hashes as a flat u64 array."""
    arr = np.asarray(hashes, dtype=np.uint64)
    if arr.ndim != 1:
        raise ValueError(f"hashes must be 1-D, got shape {list(arr.shape)}")
    return arr
