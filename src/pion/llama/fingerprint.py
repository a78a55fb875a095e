"""The prefix fingerprint and the slot file name derived from it.

Owns one function, :func:`fingerprint`: SHA-256 over a canonical JSON document of everything
that decides whether saved K/V can be reused (docs/llama.md): model id, model file
identity (size + mtime when the GGUF is readable here), server id (plus the server's build),
harness id/version, our version, the rendering keys (tools, chat_template_kwargs, ...) and
the prefix text. Changing any of them yields a new fingerprint and so a new file: stale K/V
is never restored, it is simply not found.

Canonical JSON (sorted keys, no whitespace, UTF-8) keeps the key unambiguous: no field can
bleed into its neighbour, whatever characters a model name contains.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pion import __version__
from pion.llama.prefix import WarmRequest

__all__ = [
    "FILE_PREFIX",
    "FingerprintInputs",
    "ModelFile",
    "file_name",
    "fingerprint",
    "model_file_identity",
]

FILE_PREFIX = "pi-prefix-"
# Schema of the hashed document; bump it to invalidate every file on an incompatible change.
_SCHEMA = 1


@dataclass(frozen=True)
class ModelFile:
    """Identity of the GGUF file on disk: replacing it at the same path changes this."""

    size: int
    mtime_ns: int


def model_file_identity(path: str | os.PathLike[str] | None) -> ModelFile | None:
    """Size and mtime of the model file, or None when it is not readable from here."""
    if not path:
        return None
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return ModelFile(size=st.st_size, mtime_ns=st.st_mtime_ns)


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
            render=dict(request.render),
            prefix=request.prefix,
        )


def fingerprint(inputs: FingerprintInputs) -> str:
    """64 lowercase hex digits of SHA-256 over the canonical JSON of ``inputs``."""
    doc = {"schema": _SCHEMA, **asdict(inputs)}
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def file_name(fp: str) -> str:
    """``pi-prefix-<first 16 hex digits>.bin``, pi-prefix-cache's slot file name."""
    return f"{FILE_PREFIX}{fp[:16]}.bin"
