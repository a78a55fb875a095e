"""A float64 reference for the attention tier: one query row at a time, no tricks, the
semantics of docs/attention.md written out directly. The tests compare the kernel and the
server against it."""

from __future__ import annotations

import numpy as np


def reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    head_map: np.ndarray | None = None,
    *,
    window: int = 0,
    keys: np.ndarray | None = None,
    k_suf: np.ndarray | None = None,
    v_suf: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(out [H_q, M, D], lse [H_q, M]) in float64."""
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    h_q, m_rows, d = q.shape
    h_kv, n, _ = k.shape
    hm = np.arange(h_q) // (h_q // h_kv) if head_map is None else np.asarray(head_map)
    idx = np.arange(n) if keys is None else np.asarray(keys)
    if window > 0:
        idx = idx[idx >= n - window]
    out = np.zeros((h_q, m_rows, d))
    lse = np.zeros((h_q, m_rows))
    for h in range(h_q):
        g = int(hm[h])
        for m in range(m_rows):
            kk, vv = k64[g, idx], v64[g, idx]
            if k_suf is not None and v_suf is not None:
                visible = max(0, k_suf.shape[1] - m_rows + m + 1)
                kk = np.concatenate([kk, k_suf[g, :visible].astype(np.float64)])
                vv = np.concatenate([vv, v_suf[g, :visible].astype(np.float64)])
            s = kk @ q64[h, m] / np.sqrt(d)
            top = s.max()
            p = np.exp(s - top)
            out[h, m] = p @ vv / p.sum()
            lse[h, m] = top + np.log(p.sum())
    return out, lse


def reference_blocks(
    q: np.ndarray,
    k: np.ndarray,
    head_map: np.ndarray | None,
    *,
    block: int,
    top: int,
    selector: str = "block_mean",
) -> np.ndarray:
    """The sparse selector in float64: block scores averaged over query heads, the top
    blocks plus the last one, as sorted token indices."""
    h_q = q.shape[0]
    h_kv, n, _ = k.shape
    hm = np.arange(h_q) // (h_q // h_kv) if head_map is None else np.asarray(head_map)
    n_blocks = -(-n // block)
    scores = np.zeros(n_blocks)
    for b in range(n_blocks):
        rows = k[:, b * block : (b + 1) * block].astype(np.float64)
        for h in range(h_q):
            qh = q[h].astype(np.float64)
            if selector == "block_mean":
                scores[b] += qh @ rows[hm[h]].mean(axis=0)
            else:
                lo, hi = rows[hm[h]].min(axis=0), rows[hm[h]].max(axis=0)
                scores[b] += np.maximum(qh * lo, qh * hi).sum()
    picked = set(np.argsort(-scores, kind="stable")[: min(top, n_blocks)].tolist())
    picked.add(n_blocks - 1)
    return np.array(sorted(t for b in picked for t in range(b * block, min(n, (b + 1) * block))))
