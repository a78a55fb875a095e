"""The safetensors layout of a ``V.EXPORT`` file, byte by byte: the header writer the
server uses and the strict header reader our client uses.

A safetensors file (huggingface/safetensors, the format ``mx.load``, ``torch`` and
``safetensors.numpy`` read) is::

    offset 0        u64 little-endian    H, the header's length in bytes
    offset 8        H bytes              the header: one JSON object, UTF-8, padded
                                         with spaces (0x20) so that 8 + H is a
                                         multiple of 8 (the data then starts aligned)
    offset 8 + H    the data             every tensor's bytes, C order, little-endian,
                                         back to back

The header maps each tensor name to ``{"dtype": "F16", "shape": [...],
"data_offsets": [begin, end]}`` (byte offsets into the data, ``end - begin`` = the
product of the shape times the element size), plus an optional ``"__metadata__"``
object of string values. The tensors cover the data exactly: sorted by offset, each
begins where the previous ended, the first at 0 and the last at the end of the file.
safetensors' own reader refuses anything else, and so does :func:`read_header`.

A ``V.EXPORT`` file holds ``k.<i>`` and ``v.<i>`` for layers ``i = 0 .. L-1``, each F16
``[1, n_kv_heads, N, head_dim]`` (the cache shape of mlx-lm's ``KVCache``, which is
what Pion's client hands them to), in the order ``k.0 v.0 k.1 v.1 ...``.

Pure: numpy and the standard library only, so the client and the server share it.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ALIGNMENT",
    "DTYPE_SIZES",
    "MAX_HEADER_BYTES",
    "FormatError",
    "TensorInfo",
    "build_header",
    "read_header",
    "tensor_name",
]

# The data section starts at a multiple of this (safetensors' writer pads to 8 too).
ALIGNMENT = 8
# What our reader accepts as a header. One of ours is about 60 bytes per tensor (10 KB
# for 80 layers); safetensors itself allows 100 MB, which no file of ours comes near.
MAX_HEADER_BYTES = 1 << 20
# Element sizes of the dtypes a V.EXPORT file may carry (F16 is all it writes).
DTYPE_SIZES: Mapping[str, int] = {"F16": 2, "F32": 4, "BF16": 2}

_LENGTH = struct.Struct("<Q")
_METADATA = "__metadata__"


class FormatError(ValueError):
    """A safetensors header that is not what this module writes."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a file: its dtype, shape and byte range in the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def tensor_name(side: str, layer: int) -> str:
    """``k.<i>`` or ``v.<i>``: the names Pion's client reads."""
    return f"{side}.{layer}"


def build_header(
    tensors: Sequence[tuple[str, str, Sequence[int]]], metadata: Mapping[str, str] | None = None
) -> tuple[bytes, list[TensorInfo]]:
    """The file's first bytes (the length prefix and the padded JSON header) for
    ``tensors`` = ``(name, dtype, shape)`` laid out in the given order, and where each
    one's data goes (offsets relative to the data section)."""
    entries: dict[str, object] = {}
    if metadata:
        entries[_METADATA] = {str(k): str(v) for k, v in metadata.items()}
    infos: list[TensorInfo] = []
    offset = 0
    for name, dtype, shape in tensors:
        if name == _METADATA or name in entries:
            raise FormatError(f"tensor name {name!r} is reserved or repeated")
        size = DTYPE_SIZES.get(dtype)
        if size is None:
            raise FormatError(f"unknown dtype {dtype!r}")
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise FormatError(f"negative dimension in {name}: {dims}")
        nbytes = math.prod(dims) * size
        info = TensorInfo(name, dtype, dims, offset, offset + nbytes)
        infos.append(info)
        offsets = [info.begin, info.end]
        entries[name] = {"dtype": dtype, "shape": list(dims), "data_offsets": offsets}
        offset = info.end
    text = json.dumps(entries, separators=(",", ":")).encode("utf-8")
    padded = len(text) + (-(_LENGTH.size + len(text)) % ALIGNMENT)
    return _LENGTH.pack(padded) + text.ljust(padded, b" "), infos


def read_header(head: bytes, file_size: int) -> tuple[int, dict[str, TensorInfo]]:
    """Parse the header at the start of a file of ``file_size`` bytes. ``head`` must
    hold at least the length prefix and the header (see :data:`MAX_HEADER_BYTES`).

    Returns the offset of the data section and the tensors by name; raises
    :class:`FormatError` unless the tensors cover the data exactly."""
    if len(head) < _LENGTH.size:
        raise FormatError("file shorter than its length prefix")
    (length,) = _LENGTH.unpack_from(head)
    if length > MAX_HEADER_BYTES:
        raise FormatError(f"header of {length} bytes exceeds {MAX_HEADER_BYTES}")
    data_start = _LENGTH.size + length
    if data_start > file_size or data_start > len(head):
        raise FormatError(f"header of {length} bytes runs past the file")
    try:
        parsed = json.loads(head[_LENGTH.size : data_start].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"header is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise FormatError("header is not a JSON object")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in parsed.items():
        if name == _METADATA:
            continue
        tensors[name] = _tensor(name, entry)
    expected = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != expected:
            raise FormatError(f"{info.name} begins at {info.begin}, expected {expected}")
        expected = info.end
    if data_start + expected != file_size:
        raise FormatError(f"tensors end at {data_start + expected} bytes, the file has {file_size}")
    return data_start, tensors


def _tensor(name: str, entry: object) -> TensorInfo:
    if not isinstance(entry, dict):
        raise FormatError(f"{name}: entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise FormatError(f"{name}: unsupported dtype {dtype!r}")
    size = DTYPE_SIZES[dtype]
    if not (isinstance(shape, list) and all(_count(d) for d in shape)):
        raise FormatError(f"{name}: bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)):
        raise FormatError(f"{name}: bad data_offsets {offsets!r}")
    begin, end = offsets
    if end - begin != math.prod(shape) * size:
        raise FormatError(f"{name}: {end - begin} bytes for shape {shape} of {dtype}")
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _count(value: object) -> bool:
    """A JSON non-negative integer (bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
