"""The slot-file manifest of the shared store, and the keys a slot file is stored under.

Owns :class:`Manifest` (what a peer must know before it pulls a slot file, and what it
checks after), its JSON form, its strict parser, the key names, and the limits that bound
what a store may make a proxy download. The store is any Redis-protocol keyspace:
pion-server's, or a plain Redis/Valkey. One slot file takes these string keys::

    <prefix><fingerprint>                    the manifest, JSON (below), written last
    <prefix><fingerprint>:<upload>:<i>       chunk i (0-based) of the file, CHUNK_BYTES each
                                             (the last one shorter)

A conversation checkpoint (:mod:`pion.llama.checkpoint`) is a slot file like any (its own
fingerprint), and is also listed under the prefix it continues, in a hash::

    <prefix>conv:<prefix fingerprint>        field: the checkpoint's fingerprint; value:
                                             "<tokens> <SHA-256 of those tokens>"

``<prefix>`` is ``pion:llama:`` by default; ``<fingerprint>`` the 64 hex digits of the
prefix fingerprint; ``<upload>`` 16 random hex digits chosen by the writer. Because a
writer stores every chunk before it sets the manifest, and chunk keys are new for every
upload, a reader that finds a manifest finds the chunks it names: a writer that dies
mid-upload leaves only unreferenced chunks (they expire with the store TTL), and a second
writer of the same fingerprint never overwrites chunks someone is reading.

Manifest, a JSON object (version 1)::

    {"version": 1, "fingerprint": "<64 hex>", "file": "pi-prefix-<16 hex>.bin",
     "size": 12345, "sha256": "<64 hex>", "chunk_bytes": 4194304, "chunks": 1,
     "upload": "<16 hex>", "tokens": 1228, "prefill_ms": 812.5,
     "build": "b11434-...", "model": {"id": "...", "size": 123, "sample_sha256": "..."},
     "n_ctx": 4096, "layout": {...} | null, "created": 1760000000.0, "origin": "host"}

``tokens`` is the prefix's token count, ``prefill_ms`` the cold prefill time measured when
the file was built (the receipt credits it), ``n_ctx`` the slot context of the server that
built it and ``layout`` what :func:`pion.llama.slotfile.read_layout` read from the file
(null when the layout is not a plain K/V cache). A manifest is untrusted input: every
field is type- and range-checked, and the sizes are bounded before anything is pulled.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from pion.llama.fingerprint import file_name
from pion.llama.slotfile import SlotLayout

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_KEY_PREFIX",
    "MANIFEST_VERSION",
    "MAX_CHUNK_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_SLOT_FILE_BYTES",
    "Manifest",
    "checkpoints_key",
    "chunk_key",
    "manifest_key",
]

DEFAULT_KEY_PREFIX = "pion:llama:"
MANIFEST_VERSION = 1
# One chunk is one SET/GET bulk: far below Redis's proto-max-bulk-len (512 MB), large
# enough that a round trip per chunk is noise next to moving 4 MB, small enough that a
# chunk in flight holds little memory on either side.
CHUNK_BYTES = 4 * 1024 * 1024
# A peer's chunk size is accepted up to this (the reader holds one chunk at a time).
MAX_CHUNK_BYTES = 64 * 1024 * 1024
# The largest slot file pulled: a 128k-token slot of a 70B model (80 layers, 8 KV heads
# x 128 dims, K and V at f16) is 40 GiB.
MAX_SLOT_FILE_BYTES = 64 * 1024**3
# A manifest is a few hundred bytes plus the layout (two short lists per layer).
MAX_MANIFEST_BYTES = 256 * 1024
_MAX_TEXT = 512
_MAX_PREFILL_MS = 86_400_000  # KV.PREFIX.LOOKUP's PREFILL_MS bound
_HEX64 = re.compile(r"[0-9a-f]{64}")
_UPLOAD = re.compile(r"[0-9a-f]{16,64}")


def manifest_key(prefix: str, fingerprint: str) -> str:
    return f"{prefix}{fingerprint}"


def chunk_key(prefix: str, fingerprint: str, upload: str, index: int) -> str:
    return f"{prefix}{fingerprint}:{upload}:{index}"


def checkpoints_key(prefix: str, prefix_fp: str) -> str:
    return f"{prefix}conv:{prefix_fp}"


@dataclass(frozen=True)
class Manifest:
    """One slot file in the store."""

    fingerprint: str
    size: int
    sha256: str
    chunks: int
    upload: str
    tokens: int
    prefill_ms: float
    build: str
    model: dict[str, Any]
    n_ctx: int
    layout: SlotLayout | None
    chunk_bytes: int = CHUNK_BYTES
    created: float = 0.0
    origin: str = ""
    version: int = MANIFEST_VERSION
    file: str = field(default="")

    def __post_init__(self) -> None:
        if not self.file:
            object.__setattr__(self, "file", file_name(self.fingerprint))

    def chunk_size(self, index: int) -> int:
        """Bytes of chunk ``index``: ``chunk_bytes``, the last one what is left."""
        return min(self.chunk_bytes, self.size - index * self.chunk_bytes)

    def to_bytes(self) -> bytes:
        doc = asdict(self)
        doc["layout"] = self.layout.to_json() if self.layout else None
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, raw: bytes, fingerprint: str) -> Manifest:
        """A manifest read from the store for ``fingerprint``; ValueError when it is not
        one this version can trust."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest is {len(raw)} bytes (limit {MAX_MANIFEST_BYTES})")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"manifest is not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ValueError("manifest is not an object")
        if doc.get("version") != MANIFEST_VERSION:
            raise ValueError(f"manifest version {doc.get('version')!r} (want 1)")
        return cls(**_checked(doc, fingerprint))


def _int(doc: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = doc.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"manifest {key} is not an integer in {lo}..{hi}")
    return value


def _text(doc: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ValueError(f"manifest {key} is not a string")
    if pattern is not None and not pattern.fullmatch(value):
        raise ValueError(f"manifest {key} is malformed")
    return value


def _number(doc: dict[str, Any], key: str, hi: float) -> float:
    value = doc.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"manifest {key} is not a number")
    if not 0 <= value <= hi or math.isnan(value):
        raise ValueError(f"manifest {key} out of range")
    return float(value)


def _model(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not isinstance(value.get("id"), str):
        raise ValueError("manifest model is not an object with an id")
    size, sample = value.get("size"), value.get("sample_sha256")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
        raise ValueError("manifest model size is not an integer")
    if sample is not None and not (isinstance(sample, str) and _HEX64.fullmatch(sample)):
        raise ValueError("manifest model sample_sha256 is malformed")
    return {"id": value["id"][:_MAX_TEXT], "size": size, "sample_sha256": sample}


def _checked(doc: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    fp = _text(doc, "fingerprint", _HEX64)
    if fp != fingerprint:
        raise ValueError(f"manifest is for {fp[:16]}…, not {fingerprint[:16]}…")
    size = _int(doc, "size", 1, MAX_SLOT_FILE_BYTES)
    chunk_bytes = _int(doc, "chunk_bytes", 1, MAX_CHUNK_BYTES)
    chunks = _int(doc, "chunks", 1, MAX_SLOT_FILE_BYTES)
    if chunks != -(-size // chunk_bytes):
        raise ValueError(f"manifest says {chunks} chunks for {size} bytes of {chunk_bytes}")
    if doc.get("file") != file_name(fp):
        raise ValueError("manifest file name does not match its fingerprint")
    if "layout" not in doc:
        raise ValueError("manifest lacks layout (null when unknown)")
    layout = doc["layout"]
    return {
        "fingerprint": fp,
        "file": file_name(fp),
        "size": size,
        "sha256": _text(doc, "sha256", _HEX64),
        "chunk_bytes": chunk_bytes,
        "chunks": chunks,
        "upload": _text(doc, "upload", _UPLOAD),
        "tokens": _int(doc, "tokens", 1, 2**31 - 1),
        "prefill_ms": _number(doc, "prefill_ms", _MAX_PREFILL_MS),
        "build": _text(doc, "build"),
        "model": _model(doc.get("model")),
        "n_ctx": _int(doc, "n_ctx", 0, 2**31 - 1),
        "layout": SlotLayout.from_json(layout) if layout is not None else None,
        "created": _number(doc, "created", 1e11),
        "origin": _text(doc, "origin"),
        "version": MANIFEST_VERSION,
    }
