"""``KV.PREFIX.WARM``: WARM slots built from a namespace's V-store rows, by reference.

A namespace's K and V halves (``<ns>_pk``/``<ns>_pv``) hold each layer as token-major
rows ``[N, H*D]`` in a storage format. Warming a layer makes the slot the ``[H, N, D]``
view of those rows (no transpose in memory; the kernel takes the strides as they are):

- **fp16 layers are held as they are stored**: the slot's K and V are read-only views
  of the V-store's own buffers, nothing is converted or copied. Queries widen them to
  fp32 a key block at a time (``pion.attend.kernel``), so no full-size fp32 copy of a
  layer ever exists. The views are the V-store's *leases* (``pion.vstore.layer``): a
  later write to those rows moves the V-store's run to a fresh buffer first, so a slot
  keeps the rows it was warmed with, exactly as a WARM that copied them would.
- **Every other format is decoded once** into fp32 rows (a quantized layer has no
  usable stored value to point at), the V-store's ordinary read.

A slot's bytes (what ``--attend-maxmemory`` bounds and ``sdpa_warm_bytes`` shows) are
those of the arrays it holds: 2 per value for fp16, 4 for the rest. Rows shared with the
V-store count in both: either side may drop them independently (an eviction or a
``DROP`` of the namespace leaves a WARM slot's rows alive until the slot goes).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import numpy.typing as npt

from pion.attend.tables import KV, AttentionTables
from pion.errors import PionError
from pion.vstore import VStore

__all__ = ["WarmPlan", "plan", "warm"]

CMD = "KV.PREFIX.WARM"

# (layer index, rows to warm, bytes per stored value in the slot)
WarmPlan = list[tuple[int, int, int]]


def plan(vstore: VStore, k_sid: bytes, v_sid: bytes, h: int, d: int) -> tuple[WarmPlan, int]:
    """The layers both halves hold with dim ``H*D``: ``(plan, layers skipped for their
    dim)``. Layers without rows on either half are not counted (as in Pion)."""
    halves = (vstore.describe(k_sid), vstore.describe(v_sid))
    layers: WarmPlan = []
    skipped = 0
    for k_layer in halves[0].layers:
        v_layer = halves[1].layer(k_layer.index)
        if v_layer is None or not k_layer.tpl or not v_layer.tpl:
            continue
        if k_layer.dim != h * d or v_layer.dim != h * d:
            skipped += 1
            continue
        # fp16 on both halves is held as stored; otherwise each half is fp32 (decoded).
        width = 2 if k_layer.fmt == v_layer.fmt == "fp16" else 4
        layers.append((k_layer.index, min(k_layer.tpl, v_layer.tpl), width))
    return layers, skipped


def _rows(
    vstore: VStore, sid: bytes, layer: int, rows: int, native: bool
) -> npt.NDArray[np.generic]:
    # native: the fp16 layer comes back as the leased view of its stored rows (or fp16
    # rows joined across runs); otherwise decoded to fp32.
    got = vstore.fetch_range(sid, layer, 0, rows, native=native)
    if got is None:  # cannot happen: both halves hold rows 0 .. rows-1
        raise PionError(f"{CMD}: layer {layer} of {sid!r} holds no rows")
    return got


def warm(
    vstore: VStore,
    tables: AttentionTables,
    halves: tuple[bytes, bytes],
    *,
    h: int,
    d: int,
    attend_sid: bytes,
) -> tuple[int, int]:
    """Make every layer both ``halves`` (K sid, V sid) hold a WARM slot
    ``(attend_sid, layer)`` ``[H, N, D]`` (N = the rows both hold), stamped most
    recent. Returns ``(layers rehydrated, layers skipped for their dim)``; a layer that
    can never fit the byte budget is refused (``OOM``) before any slot changes."""
    layers, skipped = plan(vstore, halves[0], halves[1], h, d)
    for _, rows, width in layers:
        tables.check_fits(2 * rows * h * d * width)
    for layer, rows, width in layers:
        k_rows, v_rows = (_rows(vstore, sid, layer, rows, width == 2) for sid in halves)
        # The slot keeps the arrays fetch_range returned (the V-store's leases are on
        # those objects, not on views derived from them) beside their [H, N, D] views.
        k, v = (cast(KV, a.reshape(rows, h, d).transpose(1, 0, 2)) for a in (k_rows, v_rows))
        tables.put((attend_sid, layer), k, v, owners=(k_rows, v_rows))
    return len(layers), skipped
