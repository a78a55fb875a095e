"""Writing one ``V.EXPORT`` file: a request's checks, then its tensors, from the V-store
to a file descriptor.

Per layer ``i`` and side (``k`` from the keys' session, ``v`` from the values'), the
rows ``start .. end-1`` (``[N, H*D]``, token-major, head-major within a row, as the
V-store keeps them) become the tensor ``[1, H, N, D]`` F16 (heads first, as an
attention cache holds them). fp16 layers give their stored 16-bit values as they are
(no conversion: the same bits ``V.FETCH ... FMT NATIVE`` sends); other formats are
decoded to fp32 and rounded to fp16, and a value beyond fp16's range (possible only
for a few formats' extreme scales) refuses the export rather than writing inf.

Memory: a layer is converted and transposed in slices of :data:`CHUNK_BYTES`, written
with ``pwrite`` at their place in the file, so besides what a ``V.FETCH`` of that layer
builds (nothing for fp16: a view of the stored rows) a write holds one slice. With one
head (``H = 1``, how our client asks) a slice of an fp16 layer is written straight from
the stored rows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pion.errors import PionError
from pion.export.format import build_header, tensor_name
from pion.vstore import VStore

__all__ = ["CHUNK_BYTES", "ExportRequest", "check_request", "write_tensors"]

# fp16 output bytes converted and written per slice. 2 MiB keeps a slice in cache;
# larger slices measured no faster.
CHUNK_BYTES = 2 << 20

_SIDES = ("k", "v")


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """``V.EXPORT sid_k sid_v start end n_layers n_kv_heads head_dim``, parsed."""

    sid_k: bytes
    sid_v: bytes
    start: int
    end: int
    n_layers: int
    n_kv_heads: int
    head_dim: int

    @property
    def rows(self) -> int:
        return self.end - self.start

    @property
    def tensor_bytes(self) -> int:
        return self.n_kv_heads * self.rows * self.head_dim * 2

    def sids(self) -> tuple[bytes, bytes]:
        return self.sid_k, self.sid_v


def check_request(vs: VStore, req: ExportRequest) -> int:
    """Refuse a request the sessions cannot serve; returns the file's data bytes.

    Every layer ``0 .. n_layers-1`` of both sessions must exist, hold rows in
    ``[start, end)`` and be ``n_kv_heads * head_dim`` wide."""
    width = req.n_kv_heads * req.head_dim
    for side, sid in zip(_SIDES, req.sids(), strict=True):
        info = vs.describe(sid, touch=False)
        for i in range(req.n_layers):
            layer = info.layer(i)
            what = f"V.EXPORT: layer {i} of the {side} session"
            if layer is None or layer.tpl <= req.start:
                raise PionError(f"{what} holds no rows in [{req.start}, {req.end})")
            if layer.dim != width:
                raise PionError(
                    f"{what} has dim {layer.dim}, not n_kv_heads*head_dim = "
                    f"{req.n_kv_heads}*{req.head_dim} = {width}"
                )
    return 2 * req.n_layers * req.tensor_bytes


def write_tensors(fd: int, vs: VStore, req: ExportRequest, metadata: Mapping[str, str]) -> int:
    """Write the whole file for ``req`` to ``fd`` (checked by :func:`check_request`);
    returns the bytes written."""
    shape = (1, req.n_kv_heads, req.rows, req.head_dim)
    names = [tensor_name(side, i) for i in range(req.n_layers) for side in _SIDES]
    head, infos = build_header([(name, "F16", shape) for name in names], metadata)
    _pwrite_all(fd, head, 0)
    base = len(head)
    for info in infos:
        side, _, layer = info.name.partition(".")
        sid = req.sid_k if side == "k" else req.sid_v
        rows = vs.fetch_range(sid, int(layer), req.start, req.end, native=True)
        if rows is None:  # check_request saw rows; nothing ran in between
            raise PionError(f"V.EXPORT: {info.name} has no rows")
        _write_tensor(fd, rows, base + info.begin, req, info.name)
    return base + (infos[-1].end if infos else 0)


def _write_tensor(
    fd: int, rows: npt.NDArray[np.generic], offset: int, req: ExportRequest, name: str
) -> None:
    n, heads, head_dim = req.rows, req.n_kv_heads, req.head_dim
    step = max(1, CHUNK_BYTES // (heads * head_dim * 2))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        half = _half(rows[lo:hi], name, req.start + lo)
        if heads == 1:
            _pwrite_all(fd, half, offset + lo * head_dim * 2)
            continue
        # [rows, H, D] -> head h's rows lo..hi sit at (h*N + lo)*D in the [H, N, D] tensor.
        blocks = half.reshape(hi - lo, heads, head_dim)
        for h in range(heads):
            part = np.ascontiguousarray(blocks[:, h, :])
            _pwrite_all(fd, part, offset + (h * n + lo) * head_dim * 2)


def _half(rows: npt.NDArray[np.generic], name: str, first_row: int) -> npt.NDArray[np.float16]:
    """``rows`` as little-endian fp16: stored fp16 as it is, decoded fp32 rounded."""
    if rows.dtype == np.dtype("<f2"):
        return np.ascontiguousarray(rows).view(np.float16)
    with np.errstate(over="ignore"):  # an overflow is reported below, by row
        half = np.asarray(rows, dtype="<f2")
    if not np.isfinite(half).all():
        bad = int(np.argwhere(~np.isfinite(half))[0][0])
        raise PionError(
            f"V.EXPORT: {name} row {first_row + bad} holds a value beyond fp16's range "
            "(+-65504); the file is F16: fetch this layer with V.FETCH"
        )
    return half


def _pwrite_all(fd: int, data: npt.NDArray[np.generic] | bytes, offset: int) -> None:
    view = memoryview(data if isinstance(data, bytes) else data.data).cast("B")
    done = 0
    while done < len(view):
        wrote = os.pwrite(fd, view[done:], offset + done)
        if wrote <= 0:
            raise OSError(f"pwrite wrote {wrote} bytes")
        done += wrote
