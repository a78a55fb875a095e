"""A session's metadata in the tier: the meta hash, read back strictly.

The hash at ``keys.KeyLayout.meta(sid)`` has these fields (all values ASCII except
``sid``):

==========  ===========================================================================
field       value
==========  ===========================================================================
``ver``     the format version, ``1``
``gen``     16 lower-case hex digits, random per creation (``keys.py``)
``sid``     the session id, raw bytes (a check that the key is the one we meant)
``dim``     ``default_dim`` of the session's ``CreateSession`` (0: none, SCHEMA only)
``fmt``     ``default_fmt`` (a format name)
``schema``  empty for a uniform session, else ``fmt:dim`` per layer joined by ``,``
            (``fmt:dim:rope`` for a layer with a rope, ``bf16_rope_fp8_body``)
``t:<i>``   layer ``i``'s row high-water mark (absent = no rows)
==========  ===========================================================================

Everything read from the tier is untrusted (another deployment, an older build or a
person with redis-cli may have written it), so :func:`parse_meta` checks every field
against the format and this server's limits and raises :class:`TierFormatError`
instead of handing the V-store anything it would not accept from a client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pion.codecs import ALL_FORMAT_NAMES, FORMAT_NAMES, Codec, get_codec
from pion.config import VStoreLimits
from pion.errors import PionError
from pion.tier.keys import FORMAT_VERSION, MAX_LAYERS, MAX_ROWS
from pion.vstore import CreateSession
from pion.vstore.session import check_rope

__all__ = ["Layout", "TierFormatError", "TierMeta", "parse_meta"]

_GEN = re.compile(rb"[0-9a-f]{16}")
_INT = re.compile(rb"0|[1-9][0-9]{0,9}")
# ver, gen, sid, dim, fmt, schema and one t:<i> per layer.
_MAX_FIELDS = 6 + MAX_LAYERS
_MAX_SCHEMA_TEXT = 64 * 1024


class TierFormatError(Exception):
    """What the tier holds for a session is not a valid format-1 session."""


@dataclass(frozen=True, slots=True)
class Layout:
    """The layout part of a ``CreateSession``: what must agree between the tier's
    copy of a session and a local one."""

    default_dim: int
    default_fmt: str
    schema: tuple[tuple[str, int], ...] | None
    ropes: tuple[int, ...] | None = None  # as CreateSession: SCHEMA only, None if all 0

    @classmethod
    def of(cls, m: CreateSession) -> Layout:
        return cls(m.default_dim, m.default_fmt, m.schema, m.ropes)

    def create(self, sid: bytes) -> CreateSession:
        return CreateSession(sid, self.default_dim, self.default_fmt, self.schema, self.ropes)

    def layer(self, index: int) -> tuple[str, int] | None:
        """The ``(format, dim)`` layer ``index`` stores in; None past a SCHEMA."""
        if self.schema is None:
            return self.default_fmt, self.default_dim
        return self.schema[index] if 0 <= index < len(self.schema) else None

    def codec(self, index: int) -> Codec:
        """The codec of layer ``index`` (its rope included)."""
        spec = self.layer(index)
        if spec is None:
            raise TierFormatError(f"layer {index} is beyond the session's SCHEMA")
        rope = self.ropes[index] if self.ropes is not None else 0
        return get_codec(spec[0], rope)

    def row_bytes(self, index: int) -> int:
        spec = self.layer(index)
        if spec is None:
            raise TierFormatError(f"layer {index} is beyond the session's SCHEMA")
        return self.codec(index).row_bytes(spec[1])

    def fields(self) -> dict[str, str]:
        schema = ""
        if self.schema is not None:
            ropes = self.ropes or (0,) * len(self.schema)
            schema = ",".join(
                f"{f}:{d}:{r}" if r else f"{f}:{d}"
                for (f, d), r in zip(self.schema, ropes, strict=True)
            )
        return {"dim": str(self.default_dim), "fmt": self.default_fmt, "schema": schema}


@dataclass(frozen=True, slots=True)
class TierMeta:
    sid: bytes
    gen: str
    layout: Layout
    tpl: dict[int, int]  # layer -> row high-water mark, only layers holding rows

    @property
    def nbytes(self) -> int:
        """Stored-format bytes of rows below the high-water marks."""
        return sum(tpl * self.layout.row_bytes(i) for i, tpl in self.tpl.items())


def parse_meta(sid: bytes, fields: dict[bytes, bytes], limits: VStoreLimits) -> TierMeta:
    """Check a meta hash (as HGETALL returns it) field by field."""
    if len(fields) > _MAX_FIELDS:
        raise TierFormatError(f"meta has {len(fields)} fields (at most {_MAX_FIELDS})")
    if fields.get(b"ver") != str(FORMAT_VERSION).encode():
        raise TierFormatError(f"meta format version {fields.get(b'ver')!r:.20} is not 1")
    gen = fields.get(b"gen", b"")
    if not _GEN.fullmatch(gen):
        raise TierFormatError("meta generation is not 16 hex digits")
    if fields.get(b"sid") != sid:
        raise TierFormatError("meta names another session")
    layout = _layout(fields, limits)
    tpl: dict[int, int] = {}
    for name, value in fields.items():
        if not name.startswith(b"t:"):
            if name not in (b"ver", b"gen", b"sid", b"dim", b"fmt", b"schema"):
                raise TierFormatError(f"unknown meta field {name[:32]!r}")
            continue
        layer = _int(name[2:], "layer index")
        rows = _int(value, f"layer {layer} rows")
        if layer >= min(limits.max_layers, MAX_LAYERS) or layout.layer(layer) is None:
            raise TierFormatError(f"meta names layer {layer}, beyond the session's layers")
        if rows > min(limits.max_rows, MAX_ROWS):
            raise TierFormatError(
                f"layer {layer} holds {rows} rows in the tier; this server allows "
                f"{min(limits.max_rows, MAX_ROWS)}"
            )
        if rows:
            tpl[layer] = rows
    return TierMeta(sid, gen.decode(), layout, tpl)


def _layout(fields: dict[bytes, bytes], limits: VStoreLimits) -> Layout:
    dim = _int(fields.get(b"dim", b""), "default dim")
    fmt = _format(fields.get(b"fmt", b""))
    raw = fields.get(b"schema", b"")
    if len(raw) > _MAX_SCHEMA_TEXT:
        raise TierFormatError("schema field too long")
    if not raw:
        if not 1 <= dim <= limits.max_dim:
            raise TierFormatError(f"default dim {dim} out of range (1..{limits.max_dim})")
        if fmt not in FORMAT_NAMES:
            raise TierFormatError(f"format {fmt} exists only in a SCHEMA")
        return Layout(dim, fmt, None)
    specs = raw.split(b",")
    if not 1 <= len(specs) <= limits.max_schema_layers or dim > limits.max_dim:
        raise TierFormatError("schema outside this server's limits")
    schema: list[tuple[str, int]] = []
    ropes: list[int] = []
    for index, spec in enumerate(specs):
        parts = spec.split(b":")
        if len(parts) not in (2, 3):
            raise TierFormatError("schema dim missing (want fmt:dim[:rope])")
        layer_fmt, layer_dim = _format(parts[0]), _int(parts[1], "schema dim")
        rope = _int(parts[2], "schema rope") if len(parts) == 3 else 0
        if not 1 <= layer_dim <= limits.max_dim:
            raise TierFormatError(f"schema dim out of range (1..{limits.max_dim})")
        try:
            check_rope(layer_fmt, layer_dim, rope, f"layer {index}")
        except PionError as exc:
            raise TierFormatError(exc.message) from None
        schema.append((layer_fmt, layer_dim))
        ropes.append(rope)
    if fmt != schema[0][0]:
        raise TierFormatError("default format of a SCHEMA session is not its layer 0's")
    return Layout(dim, fmt, tuple(schema), tuple(ropes) if any(ropes) else None)


def _format(raw: bytes) -> str:
    name = raw.decode("ascii", "replace")
    if name not in ALL_FORMAT_NAMES:
        raise TierFormatError(f"unknown format {raw[:32]!r}")
    return name


def _int(raw: bytes, what: str) -> int:
    if not _INT.fullmatch(raw):
        raise TierFormatError(f"{what} is not a non-negative integer: {raw[:32]!r}")
    return int(raw)
