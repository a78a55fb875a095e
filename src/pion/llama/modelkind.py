"""Does the model keep state that this llama.cpp build's slot files may not carry?

Owns the detection from the model's metadata: :func:`read_gguf_metadata` reads the
key/value header of a GGUF file (only the header: arrays are skipped, tensors never read;
the format is small and stable, so no dependency on the ``gguf`` package at run time),
:func:`classify_metadata` decides the :class:`ModelKind` from it, and
:func:`detect_model_state` does both for the model ``GET /props`` names.

What b11434 does, measured on generated models (``tests/llama/test_modelkind.py``): a slot
file of a sliding-window model (``<arch>.attention.sliding_window``: Gemma 2/3, gpt-oss,
Cohere 2...) restores without error but the next request reuses nothing, unless the
server runs with ``--swa-full`` (then the whole cache is kept and a restore reuses all
of it); a recurrent (Mamba, RWKV) or hybrid (Jamba, Granite hybrid, LFM2, Qwen3-Next...)
model's restore also succeeds and reuses nothing, with or without ``--swa-full``. The
architecture lists are llama.cpp's ``llm_arch_is_recurrent`` / ``llm_arch_is_hybrid``;
``ssm.*``, ``wkv.*`` and ``shortconv.*`` keys mark the same for an architecture not listed.

Everything here but :func:`read_gguf_metadata` is pure; that one does blocking file I/O
(call it off the event loop).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

__all__ = [
    "HYBRID_ARCHS",
    "RECURRENT_ARCHS",
    "ModelKind",
    "ModelState",
    "classify_metadata",
    "detect_model_state",
    "read_gguf_metadata",
]

RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
# Key infixes of recurrent state (after "<arch>."): Mamba's ssm, RWKV's wkv, LFM2's conv.
_STATE_KEYS = ("ssm.", "wkv.", "shortconv.")


class ModelKind(StrEnum):
    ATTENTION = "attention"  # plain attention: slot files carry the whole state
    SLIDING_WINDOW = "sliding-window"
    RECURRENT = "recurrent"
    HYBRID = "hybrid"
    UNKNOWN = "unknown"  # the model file could not be read


@dataclass(frozen=True)
class ModelState:
    """What the model keeps, and whether this build's slot files may lose some of it."""

    kind: ModelKind
    arch: str | None
    reason: str
    sliding_window: int | None = None
    # Whether the server runs with --swa-full (None: not known to the caller).
    swa_full: bool | None = None

    @property
    def slot_files_partial(self) -> bool:
        """True when a restored slot file may reuse nothing: recurrent and hybrid models,
        and sliding-window ones unless the server is known to run with ``--swa-full``."""
        if self.kind in (ModelKind.RECURRENT, ModelKind.HYBRID):
            return True
        return self.kind is ModelKind.SLIDING_WINDOW and self.swa_full is not True

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "arch": self.arch,
            "reason": self.reason,
            "sliding_window": self.sliding_window,
            "swa_full": self.swa_full,
            "slot_files_partial": self.slot_files_partial,
        }


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def classify_metadata(meta: Mapping[str, Any], swa_full: bool | None = None) -> ModelState:
    """The kind of model a GGUF's key/values (as :func:`read_gguf_metadata` gives them)
    describe. ``swa_full``: whether the server runs with ``--swa-full``, if known."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return ModelState(ModelKind.UNKNOWN, None, "the GGUF names no architecture")
    state_keys = sorted(
        k for k in meta if k.startswith(arch + ".") and k[len(arch) + 1 :].startswith(_STATE_KEYS)
    )
    if arch in HYBRID_ARCHS or (state_keys and _has_attention(meta, arch)):
        why = f"{arch} is a hybrid model (attention and recurrent layers)"
        return ModelState(ModelKind.HYBRID, arch, why + _NOT_CARRIED)
    if arch in RECURRENT_ARCHS or state_keys:
        why = f"{arch} is a recurrent model ({state_keys[0] if state_keys else 'no K/V cache'})"
        return ModelState(ModelKind.RECURRENT, arch, why + _NOT_CARRIED)
    window = _positive_int(meta.get(f"{arch}.attention.sliding_window"))
    if window is not None:
        if swa_full:
            why = (
                f"{arch} uses sliding-window attention ({window} tokens); the server runs "
                "with --swa-full, so slot files keep the whole cache"
            )
        else:
            why = (
                f"{arch} uses sliding-window attention ({window} tokens): without --swa-full "
                "this llama.cpp build's slot files keep only the window, so a restore "
                "reuses nothing"
            )
        return ModelState(ModelKind.SLIDING_WINDOW, arch, why, window, swa_full)
    return ModelState(ModelKind.ATTENTION, arch, f"{arch}: plain attention", swa_full=swa_full)


_NOT_CARRIED = (
    ": this llama.cpp build's slot files do not carry its recurrent state, "
    "so a restore reuses nothing"
)


def _has_attention(meta: Mapping[str, Any], arch: str) -> bool:
    count = meta.get(f"{arch}.attention.head_count")
    return _positive_int(count) is not None


def detect_model_state(
    props: Mapping[str, Any], swa_full: bool | None = None, model_path: str | None = None
) -> ModelState:
    """The :class:`ModelState` of the model ``props`` (``GET /props``) names, read from its
    GGUF (``model_path`` overrides the path /props gives, e.g. for a remote server whose
    model is mounted elsewhere). An unreadable file gives :attr:`ModelKind.UNKNOWN`:
    verification of a restore is then the only judge. Blocking file I/O."""
    path = model_path or props.get("model_path")
    if not isinstance(path, str) or not path:
        return ModelState(ModelKind.UNKNOWN, None, "/props names no model file")
    try:
        meta = read_gguf_metadata(path)
    except (OSError, ValueError) as exc:
        return ModelState(ModelKind.UNKNOWN, None, f"cannot read the model's GGUF: {exc}")
    return classify_metadata(meta, swa_full)


# --- GGUF header -----------------------------------------------------------------------

_MAGIC = b"GGUF"
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# A real header is well under this; a bigger declared length means a corrupt file.
_MAX_STRING = 64 * 1024 * 1024
_MAX_KV = 1_000_000


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError("truncated GGUF header")
    return data


def _unpack(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    n = _unpack(f, "<Q")
    if n > _MAX_STRING:
        raise ValueError("GGUF string too long")
    return _read(f, n).decode("utf-8", "replace")


def _skip_array(f: BinaryIO) -> None:
    item, count = _unpack(f, "<I"), _unpack(f, "<Q")
    if item in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
    elif item == _STRING:
        for _ in range(count):
            n = _unpack(f, "<Q")
            if n > _MAX_STRING:
                raise ValueError("GGUF string too long")
            f.seek(n, 1)
    else:  # nested arrays do not occur in model files
        raise ValueError(f"unsupported GGUF array item type {item}")


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """The scalar and string key/values of a GGUF file's header (arrays skipped).
    Raises OSError when unreadable, ValueError when it is not a GGUF file."""
    with open(path, "rb") as f:
        if f.read(4) != _MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        version = _unpack(f, "<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported")
        _unpack(f, "<Q")  # tensor count
        n_kv = _unpack(f, "<Q")
        if n_kv > _MAX_KV:
            raise ValueError("GGUF header declares too many keys")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(f)
            kind = _unpack(f, "<I")
            if kind in _SCALARS:
                meta[key] = _unpack(f, _SCALARS[kind])
            elif kind == _STRING:
                meta[key] = _string(f)
            elif kind == _ARRAY:
                _skip_array(f)
            else:
                raise ValueError(f"unknown GGUF value type {kind} for {key}")
        return meta
