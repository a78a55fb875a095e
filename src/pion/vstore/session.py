"""One V-store session (its layers, LRU stamp and block table) and the checks and
conversions every way into the store shares: layout validation and row encoding.

Owned by :class:`pion.vstore.VStore`; nothing here journals, evicts or accounts.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pion.codecs import (
    ALL_FORMAT_NAMES,
    SCHEMA_ONLY_FORMATS,
    Codec,
    CodecValueError,
    get_codec,
)
from pion.config import VStoreLimits
from pion.errors import CodecError, PionError
from pion.vstore.layer import Layer
from pion.vstore.mutations import CreateSession
from pion.vstore.views import BlockTable, LayerInfo, SessionInfo, namespace_of

__all__ = [
    "ENCODE_CHUNK_BYTES",
    "MAX_SID_LEN",
    "Encoded",
    "FloatRows",
    "Session",
    "check_rope",
    "encode_for",
    "encode_rows",
    "validate_create",
]

# A sid is a key held in memory and written to every WAL record: bound it. KV.PREFIX
# namespaces are at most 200 bytes (+3 for the suffix), so this never bites a client.
MAX_SID_LEN = 512

# Input bytes (as fp32) quantized per slice of a big store (see encode_rows); 1-4 MiB
# slices measured 1.3-1.8x faster than whole 16 MiB layers on the block formats.
ENCODE_CHUNK_BYTES = 2 << 20

FloatRows = npt.NDArray[np.float32] | npt.NDArray[np.float16]
# Rows in a stored format, with the codec that made them (VStore.store's hint).
Encoded = tuple[Codec, npt.NDArray[np.uint8]]


class Session:
    """A sid's layers. Uniform (``schema`` None): layers of ``default_dim`` and
    ``default_fmt`` appear on first store. SCHEMA: exactly ``len(schema)`` layers."""

    __slots__ = (
        "blocks",
        "clock",
        "default_dim",
        "default_fmt",
        "generation",
        "group",
        "layers",
        "ropes",
        "schema",
        "sid",
        "slot",
        "snapshots",
    )

    def __init__(self, m: CreateSession, slot: int) -> None:
        self.sid = m.sid
        self.group = namespace_of(m.sid)  # its eviction group (views.namespace_of)
        self.slot = slot
        self.default_dim = m.default_dim
        self.schema = m.schema
        self.ropes = m.ropes
        self.default_fmt = m.schema[0][0] if m.schema else m.default_fmt
        self.layers: dict[int, Layer] = {}
        if m.schema is not None:
            ropes = m.ropes or (0,) * len(m.schema)
            for index, ((fmt, dim), rope) in enumerate(zip(m.schema, ropes, strict=True)):
                self.layers[index] = Layer(get_codec(fmt, rope), dim)
        self.clock = 0  # the store's logical LRU clock at the last read or write
        # The store's change counter at this session's last change of rows (see
        # VStore.generation): equal numbers mean identical rows.
        self.generation = 0
        self.blocks: BlockTable | None = None
        # Rollback snapshots (V.SNAPSHOT): snap_id -> (layer, length) of every layer.
        self.snapshots: dict[int, tuple[tuple[int, int], ...]] = {}

    def creation(self) -> CreateSession:
        """The record that creates this session's layout (for snapshots)."""
        return CreateSession(self.sid, self.default_dim, self.default_fmt, self.schema, self.ropes)

    @property
    def num_layers(self) -> int:
        if self.schema is not None:
            return len(self.schema)
        return max(self.layers) + 1 if self.layers else 0

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers.values())

    @property
    def rows(self) -> int:
        """Sum of the layers' ``tpl`` (Pion's ``total_tokens``; holes included)."""
        return sum(layer.tpl for layer in self.layers.values())

    def info(self) -> SessionInfo:
        layers = tuple(
            LayerInfo(
                i,
                lay.dim,
                lay.codec.name,
                lay.codec.format_id,
                lay.row_bytes,
                lay.tpl,
                lay.held,
                lay.codec.rope,
            )
            for i, lay in sorted(self.layers.items())
        )
        return SessionInfo(
            self.sid,
            self.slot,
            self.default_dim,
            self.default_fmt,
            self.schema,
            self.num_layers,
            layers,
        )


def validate_create(m: CreateSession, limits: VStoreLimits) -> None:
    """Refuse a layout the store cannot hold (the commands check first, with their own
    texts; this is the boundary for every other caller and for replay)."""
    if not 1 <= len(m.sid) <= MAX_SID_LEN:
        raise PionError(f"session id length must be 1..{MAX_SID_LEN}")
    max_dim = limits.max_dim
    if m.schema is None:
        if m.default_fmt in SCHEMA_ONLY_FORMATS:
            raise PionError(f"{m.default_fmt} needs the SCHEMA form (a per-layer rope=)")
        _check_fmt(m.default_fmt)
        if not 1 <= m.default_dim <= max_dim:
            raise PionError(f"invalid value_dim (must be 1-{max_dim})")
        if m.ropes is not None:
            raise PionError("a uniform session has no per-layer rope")
        return
    if not 0 <= m.default_dim <= max_dim:
        raise PionError(f"default_dim must be 0-{max_dim}")
    if not 1 <= len(m.schema) <= limits.max_schema_layers:
        raise PionError(f"SCHEMA layer count must be 1-{limits.max_schema_layers}")
    if m.ropes is not None and len(m.ropes) != len(m.schema):
        raise PionError(f"{len(m.ropes)} ropes for a SCHEMA of {len(m.schema)} layers")
    ropes = m.ropes or (0,) * len(m.schema)
    for index, ((fmt, dim), rope) in enumerate(zip(m.schema, ropes, strict=True)):
        _check_fmt(fmt)
        if not 1 <= dim <= max_dim:
            raise PionError(f"layer {index} dim must be 1-{max_dim}")
        check_rope(fmt, dim, rope, f"layer {index}")


def check_rope(fmt: str, dim: int, rope: int, where: str) -> None:
    """A layer's rope fits its format: ``1 <= rope < dim`` for a SCHEMA-only format,
    0 (absent) for every other."""
    if fmt in SCHEMA_ONLY_FORMATS:
        if not 1 <= rope < dim:
            raise PionError(f"{where} {fmt} needs rope=N with 0 < N < dim ({dim}), got {rope}")
    elif rope:
        raise PionError(f"{where} rope= applies only to fmt={'|'.join(SCHEMA_ONLY_FORMATS)}")


def _check_fmt(fmt: str) -> None:
    if fmt not in ALL_FORMAT_NAMES:
        raise PionError(f"unknown format '{fmt}' (want {'|'.join(ALL_FORMAT_NAMES)})")


def encode_rows(
    codec: Codec,
    rows: FloatRows,
    layer: int,
    start: int,
    out: npt.NDArray[np.uint8] | None = None,
) -> npt.NDArray[np.uint8]:
    """``rows`` in the stored format, ``[count, row_bytes]`` uint8, written into ``out``
    when given (the rows a store will keep: encoded once, in place). fp16 input to an
    fp16 layer is kept verbatim (a view of ``rows``, or copied into ``out``); anything
    else is quantized, and a value the format cannot hold is refused naming the layer
    and the absolute row. Pure: it may run on any thread, on any row block."""
    count, dim = int(rows.shape[0]), int(rows.shape[1])
    if rows.dtype == np.dtype("<f2") and codec.name == "fp16":
        # Opaque 16-bit patterns (Pion's PrefixStore sends bf16 bits this way).
        raw = np.ascontiguousarray(rows).view(np.uint8).reshape(count, codec.row_bytes(dim))
        if out is None:
            return raw
        out[...] = raw
        return out
    if out is None:
        out = np.empty((count, codec.row_bytes(dim)), dtype=np.uint8)
    # The numpy references make several full-size temporaries; encoding a big batch in
    # slices bounds them (and the fp16 -> fp32 widening) to ENCODE_CHUNK_BYTES of input,
    # and measured faster too (the slices stay in cache). The compiled twins make none.
    step = max(1, ENCODE_CHUNK_BYTES // (4 * dim))
    if codec.compiled and rows.dtype == np.dtype("<f4"):
        step = count
    for lo in range(0, count, step):
        _encode(codec, rows[lo : lo + step], layer, start + lo, out[lo : lo + step])
    return out


def encode_for(codec: Codec, rows: FloatRows, layer: int, start: int) -> Encoded:
    """:func:`encode_rows`, tagged with its codec: pure, so it may run on any thread;
    the result is a hint for :meth:`VStore.store` (``encoded=``)."""
    return codec, encode_rows(codec, rows, layer, start)


def _encode(
    codec: Codec, rows: FloatRows, layer: int, start: int, out: npt.NDArray[np.uint8]
) -> None:
    try:
        codec.encode(rows.astype(np.float32, copy=False), out=out)
    except CodecValueError as exc:
        raise CodecError(f"layer {layer} row {start + exc.row}: {exc.detail}") from None
    except CodecError as exc:
        raise CodecError(f"layer {layer}: {exc.message}") from None
