"""What the warmer needs to know about the llama-server it talks to.

Owns :class:`ServerInfo`, built from ``GET /props`` (``model_alias``, ``model_path``,
``build_info``, ``total_slots`` and the per-slot context
``default_generation_settings.n_ctx``), the model's identity as it is recorded beside a
slot file (:meth:`ServerInfo.model_identity`: alias and content identity, never a path,
so it means the same on every machine), and the key that hybrid/recurrent detection is
recorded under: one (server build, model file) pair, so a new build or a replaced GGUF
starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pion.llama.fingerprint import model_file_identity

__all__ = ["ServerInfo"]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class ServerInfo:
    """What ``/props`` says about the server and model, plus the model file's identity."""

    model_id: str
    model_path: str
    build: str
    # Tokens one slot holds (``-c`` / ``-np``, as the server rounds it); 0 when unknown.
    n_ctx: int = 0
    total_slots: int = 0

    @classmethod
    def from_props(cls, props: dict[str, Any]) -> ServerInfo:
        path = str(props.get("model_path") or "")
        alias = str(props.get("model_alias") or "")
        # Without --alias the server reports the model path as its alias: keep the file
        # name only, the same on every machine (an alias like "org/model" stays whole).
        if not alias or alias == path:
            alias = path.rsplit("/", 1)[-1]
        settings = props.get("default_generation_settings")
        n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else 0
        return cls(
            model_id=alias,
            model_path=path,
            build=str(props.get("build_info") or ""),
            n_ctx=n_ctx,
            total_slots=_int(props.get("total_slots")),
        )

    def model_identity(self) -> dict[str, Any]:
        """The model as a slot file's metadata records it: the same on every machine that
        serves the same GGUF (alias = file name, size, sampled content hash)."""
        ident = model_file_identity(self.model_path)
        return {
            "id": self.model_id,
            "size": ident.size if ident else None,
            "sample_sha256": ident.sample_sha256 if ident else None,
        }

    def restore_key(self) -> str:
        """Key of the (server build, model) pair that hybrid detection is recorded under."""
        ident = model_file_identity(self.model_path)
        file_part = f"{ident.size}:{ident.sample_sha256[:16]}" if ident else "?"
        return f"{self.build}|{self.model_path}|{file_part}"
