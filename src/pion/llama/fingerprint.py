"""The prefix fingerprint and the slot file name derived from it.

Owns one function, :func:`fingerprint`: SHA-256 over a canonical JSON document of everything
that decides whether saved K/V can be reused: model id, model file identity (when the
GGUF is readable here), server id (plus the server's build),
harness id/version, our version, the rendering keys (tools, chat_template_kwargs, ...) and
the prefix text. Changing any of them yields a new fingerprint and so a new file: stale K/V
is never restored, it is simply not found.

Canonical JSON (sorted keys, no whitespace, UTF-8) keeps the key unambiguous: no field can
bleed into its neighbour, whatever characters a model name contains.

The model file identity is the file's size and a SHA-256 over its first and last
:data:`MODEL_SAMPLE_BYTES` (the GGUF header with every tensor's name, type and shape, and
the first and last tensor data), never its mtime or path: two machines that downloaded the
same GGUF must compute the same fingerprint, or slot files could not be shared through a
store (docs/llama.md). The sample is read once per process and file (cached by path, size,
mtime and inode), so the cost is one 8 MiB read, not a hash of a 20 GB model.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pion import __version__
from pion.llama.prefix import WarmRequest

__all__ = [
    "FILE_PREFIX",
    "MODEL_SAMPLE_BYTES",
    "FingerprintInputs",
    "ModelFile",
    "file_name",
    "fingerprint",
    "model_file_identity",
    "tokens_digest",
]

FILE_PREFIX = "pi-prefix-"
# Schema of the hashed document; bump it to invalidate every file on an incompatible change.
# 2: the model file is identified by content (size + sampled SHA-256), not by mtime.
_SCHEMA = 2
# Bytes hashed at each end of the model file: covers a GGUF's header and tensor table
# (a few MB for large vocabularies) and the first and last tensor data.
MODEL_SAMPLE_BYTES = 4 * 1024 * 1024

_identity_cache: dict[tuple[str, int, int, int], ModelFile] = {}
_identity_lock = threading.Lock()


@dataclass(frozen=True)
class ModelFile:
    """Identity of the GGUF file's content: the same on every machine that has the file,
    different when another model (or quantization) replaces it."""

    size: int
    sample_sha256: str


def _sample_digest(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(MODEL_SAMPLE_BYTES))
        if size > 2 * MODEL_SAMPLE_BYTES:
            f.seek(size - MODEL_SAMPLE_BYTES)
        digest.update(f.read(MODEL_SAMPLE_BYTES))
    return digest.hexdigest()


def model_file_identity(path: str | os.PathLike[str] | None) -> ModelFile | None:
    """Size and sampled SHA-256 of the model file, or None when it is not readable here."""
    if not path:
        return None
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p), st.st_size, st.st_mtime_ns, st.st_ino)
        with _identity_lock:
            cached = _identity_cache.get(key)
        if cached is not None:
            return cached
        ident = ModelFile(size=st.st_size, sample_sha256=_sample_digest(p, st.st_size))
    except OSError:
        return None
    with _identity_lock:
        _identity_cache[key] = ident
    return ident


@dataclass(frozen=True)
class FingerprintInputs:
    """The fields hashed into a fingerprint."""

    model_id: str
    model_file: ModelFile | None
    server_id: str
    harness: str
    render: dict[str, Any]
    prefix: str
    version: str = __version__
    # Token mode (:attr:`WarmRequest.tokens`): the prefix's tokens stand for the prefix
    # text and the rendering keys. Left out of the hashed document when None, so the
    # fingerprints of text-mode prefixes are the ones earlier versions computed.
    tokens: tuple[int, ...] | None = None

    @classmethod
    def of(
        cls,
        request: WarmRequest,
        *,
        model_id: str,
        model_file: ModelFile | None,
        server_id: str,
        harness: str | None = None,
    ) -> FingerprintInputs:
        """Inputs for a warm request; ``harness`` overrides the request's own."""
        return cls(
            model_id=request.model or model_id,
            model_file=model_file,
            server_id=server_id,
            harness=harness if harness is not None else request.harness,
            render=dict(request.render) if request.tokens is None else {},
            prefix=request.prefix if request.tokens is None else "",
            tokens=request.tokens,
        )


def fingerprint(inputs: FingerprintInputs) -> str:
    """64 lowercase hex digits of SHA-256 over the canonical JSON of ``inputs``."""
    doc = {"schema": _SCHEMA, **asdict(inputs)}
    if doc["tokens"] is None:
        del doc["tokens"]
    else:
        doc["tokens"] = list(doc["tokens"])
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def tokens_digest(tokens: Sequence[int]) -> str:
    """SHA-256 (hex) of a token sequence: how a stored checkpoint's conversation is
    compared with a request's without sending the tokens."""
    return hashlib.sha256(array("q", tokens).tobytes()).hexdigest()


def file_name(fp: str) -> str:
    """``pi-prefix-<first 16 hex digits>.bin``, pi-prefix-cache's slot file name."""
    return f"{FILE_PREFIX}{fp[:16]}.bin"
