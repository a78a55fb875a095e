"""What the warmer needs to know about the llama-server it talks to.

Owns :class:`ServerInfo`, built from ``GET /props`` (``model_alias``, ``model_path``,
``build_info``), and the key that hybrid/recurrent detection is recorded under: one
(server build, model file) pair, so a new build or a replaced GGUF starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pion.llama.fingerprint import model_file_identity

__all__ = ["ServerInfo"]


@dataclass(frozen=True)
class ServerInfo:
    """What ``/props`` says about the server and model, plus the model file's identity."""

    model_id: str
    model_path: str
    build: str

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> ServerInfo:
        path = str(props.get("model_path") or "")
        alias = str(props.get("model_alias") or "") or path.rsplit("/", 1)[-1]
        return cls(model_id=alias, model_path=path, build=str(props.get("build_info") or ""))

    def restore_key(self) -> str:
        """Key of the (server build, model) pair that hybrid detection is recorded under."""
        ident = model_file_identity(self.model_path)
        file_part = f"{ident.size}:{ident.mtime_ns}" if ident else "?"
        return f"{self.build}|{self.model_path}|{file_part}"
