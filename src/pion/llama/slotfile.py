"""What a llama-server slot file says about the cache that wrote it, read from its bytes.

Owns :func:`read_layout`, a reader of the header fields of llama.cpp's sequence-state
file (``llama_state_seq_save_file``, state version 4, build b11434) that decide whether
another llama-server can load the file: the number of K/V streams (``-np`` without a
unified cache), the layer count, V transposition, RoPE dims and, per layer, the K and V
cache types (``-ctk``/``-ctv``) with their row sizes. It also owns :func:`file_sha256`.

Layout, little-endian, as ``llama-context.cpp`` and ``llama-kv-cache.cpp`` write it::

    u32 magic 'ggsq' (0x67677371)   u32 version (4)   u32 n_packed
    i32 packed[n_packed]            the slot's prompt tokens, server-serialized
    u32 n_stream
    per stream:
      u32 cell_count                (0: nothing else for this stream)
      per cell: i32 pos, u32 n_seq_id (1 in a slot file), [ext, 12 bytes], i32 seq_id
      u32 v_trans, u32 n_layer, u32 n_rot_k, u32 n_rot_v
      per layer: i32 k_type, u64 k_row_bytes, cell_count * k_row_bytes
      v_trans 0, per layer: i32 v_type, u64 v_row_bytes, cell_count * v_row_bytes
      v_trans 1, per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
                            n_embd_v * cell_count * v_elem_bytes

Only the plain K/V cache has this layout. Sliding-window (two caches), hybrid and
recurrent models write other sections; the reader accepts a file only when its walk
ends exactly at the end of the file, and otherwise says it does not know the layout
(``None``), never guesses. Data is skipped by seeking, so a multi-gigabyte file costs a
few reads. Every count read from the file is bounded before it is used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "GGML_TYPES",
    "SEQ_MAGIC",
    "SEQ_VERSION",
    "SlotLayout",
    "file_sha256",
    "read_layout",
    "read_tokens",
]

SEQ_MAGIC = 0x67677371  # LLAMA_FILE_MAGIC_GGSQ
SEQ_VERSION = 4  # LLAMA_STATE_SEQ_VERSION in b11434
# ggml_type ids (ggml.h) of the types a K/V cache can have, with ggml's names.
GGML_TYPES: dict[int, str] = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    3: "q4_1",
    6: "q5_0",
    7: "q5_1",
    8: "q8_0",
    20: "iq4_nl",
    30: "bf16",
}
# Bounds on counts read from an untrusted file (checked before anything is read with
# them): llama.cpp's own caps are far below these.
_MAX_STREAMS = 4096  # one per slot at most (-np)
_MAX_LAYERS = 4096
_MAX_CELL_EXT = 12  # sizeof(llama_kv_cell_ext): x, y, tok
_HASH_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class SlotLayout:
    """The fields of a slot file that another llama-server checks before loading it."""

    n_stream: int
    n_layer: int
    v_trans: bool
    n_rot_k: int
    n_rot_v: int
    k_types: tuple[str, ...]
    v_types: tuple[str, ...]
    k_row_bytes: tuple[int, ...]
    v_row_bytes: tuple[int, ...]

    def cache_types(self) -> str:
        """``K f16 / V f16`` (several types when layers differ)."""
        k = "+".join(sorted(set(self.k_types)))
        v = "+".join(sorted(set(self.v_types)))
        return f"K {k} / V {v}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> SlotLayout:
        """Strict: a wrong shape raises ValueError (the data may come from a peer)."""
        if not isinstance(obj, dict):
            raise ValueError("layout is not an object")
        try:
            ints = {k: obj[k] for k in ("n_stream", "n_layer", "n_rot_k", "n_rot_v")}
            lists = {k: obj[k] for k in ("k_types", "v_types", "k_row_bytes", "v_row_bytes")}
            v_trans = obj["v_trans"]
        except KeyError as exc:
            raise ValueError(f"layout lacks {exc}") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints.values()):
            raise ValueError("layout counts are not integers")
        if not isinstance(v_trans, bool) or not all(
            isinstance(v, list | tuple) and len(v) <= _MAX_LAYERS for v in lists.values()
        ):
            raise ValueError("layout has the wrong shape")
        names = [lists["k_types"], lists["v_types"]]
        rows = [lists["k_row_bytes"], lists["v_row_bytes"]]
        if not all(isinstance(t, str) for seq in names for t in seq):
            raise ValueError("layout types are not names")
        if not all(isinstance(b, int) and not isinstance(b, bool) for seq in rows for b in seq):
            raise ValueError("layout row sizes are not integers")
        return cls(
            n_stream=ints["n_stream"],
            n_layer=ints["n_layer"],
            v_trans=v_trans,
            n_rot_k=ints["n_rot_k"],
            n_rot_v=ints["n_rot_v"],
            k_types=tuple(names[0]),
            v_types=tuple(names[1]),
            k_row_bytes=tuple(rows[0]),
            v_row_bytes=tuple(rows[1]),
        )

    def difference(self, other: SlotLayout) -> str | None:
        """Why a file of this layout cannot load into a cache of ``other``'s, or None."""
        if self.k_types != other.k_types or self.v_types != other.v_types:
            return f"cache type {self.cache_types()} != {other.cache_types()}"
        if self.n_stream != other.n_stream:
            return (
                f"{self.n_stream} K/V stream(s) != {other.n_stream} (-np without a unified "
                "cache keeps one per slot)"
            )
        if self != other:
            return "cache layout differs (layers, V transposition, RoPE dims or row sizes)"
        return None


class _Walk:
    """Sequential reads with seeks over one open file; raises ValueError past its end."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f = f
        self.size = size
        self.pos = 0

    def read(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise ValueError("past the end of the file")
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("short read")
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ValueError("past the end of the file")
        self.pos += n
        self.f.seek(self.pos)

    def u32(self) -> int:
        value: int = struct.unpack("<I", self.read(4))[0]
        return value

    def i32(self) -> int:
        value: int = struct.unpack("<i", self.read(4))[0]
        return value

    def u64(self) -> int:
        value: int = struct.unpack("<Q", self.read(8))[0]
        return value


def _type_name(type_id: int) -> str:
    name = GGML_TYPES.get(type_id)
    if name is None:
        raise ValueError(f"unknown ggml type {type_id}")
    return name


def _cells(walk: _Walk, cell_count: int) -> None:
    """Skip the per-cell metadata; its size depends on whether cells carry an ext."""
    start = walk.pos
    for ext in (0, _MAX_CELL_EXT):
        stride = 12 + ext
        if start + cell_count * stride > walk.size:
            continue
        walk.pos = start
        walk.f.seek(start)
        meta = walk.read(cell_count * stride)
        # n_seq_id is 1 for every cell of a slot file: the check that tells the strides apart.
        if all(struct.unpack_from("<I", meta, i * stride + 4)[0] == 1 for i in range(cell_count)):
            return
    raise ValueError("cell metadata does not parse")


def _stream(walk: _Walk, cell_count: int) -> SlotLayout:
    _cells(walk, cell_count)
    v_trans, n_layer, n_rot_k, n_rot_v = (walk.u32() for _ in range(4))
    if v_trans not in (0, 1) or not 0 < n_layer <= _MAX_LAYERS:
        raise ValueError("implausible cache header")
    k_types, k_rows = [], []
    for _ in range(n_layer):
        k_types.append(_type_name(walk.i32()))
        row = walk.u64()
        k_rows.append(row)
        walk.skip(cell_count * row)
    v_types, v_rows = [], []
    for _ in range(n_layer):
        v_types.append(_type_name(walk.i32()))
        if v_trans:
            elem, n_embd = walk.u32(), walk.u32()
            v_rows.append(elem * n_embd)
            walk.skip(n_embd * cell_count * elem)
        else:
            row = walk.u64()
            v_rows.append(row)
            walk.skip(cell_count * row)
    return SlotLayout(
        n_stream=0,
        n_layer=n_layer,
        v_trans=bool(v_trans),
        n_rot_k=n_rot_k,
        n_rot_v=n_rot_v,
        k_types=tuple(k_types),
        v_types=tuple(v_types),
        k_row_bytes=tuple(k_rows),
        v_row_bytes=tuple(v_rows),
    )


def read_layout(path: Path) -> SlotLayout | None:
    """The layout of a plain-K/V slot file, or None when the file is anything else
    (another state version, a sliding-window or hybrid cache, no cells, damaged)."""
    try:
        with path.open("rb") as f:
            walk = _Walk(f, path.stat().st_size)
            return _parse(walk)
    except (OSError, ValueError, struct.error):
        return None


def _parse(walk: _Walk) -> SlotLayout | None:
    magic, version, n_packed = walk.u32(), walk.u32(), walk.u32()
    if magic != SEQ_MAGIC or version != SEQ_VERSION:
        return None
    walk.skip(4 * n_packed)
    n_stream = walk.u32()
    if not 0 < n_stream <= _MAX_STREAMS:
        return None
    found: SlotLayout | None = None
    for _ in range(n_stream):
        cell_count = walk.u32()
        if cell_count == 0:
            continue
        if found is not None:
            return None  # a slot file holds one sequence: one stream with cells
        found = _stream(walk, cell_count)
    if found is None or walk.pos != walk.size:
        return None
    return dataclasses.replace(found, n_stream=n_stream)


# LLAMA_TOKEN_NULL: the first packed word of server_tokens::serialize()'s format (a plain
# token list otherwise, as older builds wrote it).
_TOKENS_MARKER = -1
_MAX_TOKENS = 1 << 24


def read_tokens(path: Path) -> tuple[int, ...] | None:
    """The prompt tokens a slot file holds (the K/V of exactly these tokens follows), or
    None when the file is not a sequence-state file this reader knows."""
    try:
        with path.open("rb") as f:
            walk = _Walk(f, path.stat().st_size)
            magic, version, n_packed = walk.u32(), walk.u32(), walk.u32()
            if magic != SEQ_MAGIC or version != SEQ_VERSION or n_packed > _MAX_TOKENS:
                return None
            packed = struct.unpack(f"<{n_packed}i", walk.read(4 * n_packed))
    except (OSError, ValueError, struct.error):
        return None
    if not packed or packed[0] != _TOKENS_MARKER:
        return packed
    # server_tokens state: marker, u32 version, u32 count, tokens, media keys...
    if len(packed) < 3 or not 0 <= packed[2] <= len(packed) - 3:
        return None
    return packed[3 : 3 + packed[2]]


def file_sha256(path: Path) -> tuple[str, int]:
    """SHA-256 (hex) and size of a file, read in blocks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
