"""Scaled dot-product attention over a cached prefix, in numpy (fp32, stable softmax).

One function, :func:`attend`, serves every query form of the attention tier:

- ``QUERY``: queries ``[H, M, D]`` over the prefix ``[H, N, D]`` (``head_map`` identity);
- ``QUERY_FUSED``: GQA queries ``[H_q, M, D]`` over the prefix of kv-head
  ``head_map[h]`` plus a suffix ``[H_kv, S, D]``, causal within the suffix (query row
  ``m`` sees suffix keys ``0 .. S - M + m``);
- the sparse variants: the prefix restricted to a shared token subset ``keys``
  (picked by :func:`select_blocks`), plus the suffix for the fused form.

Semantics (docs/attention.md, "The queries"): scores are ``q . k / sqrt(D)``;
``window > 0`` keeps only the last ``window`` prefix tokens (the suffix is never
windowed); the prefix is fully visible to every query row. The log-sum-exp of each
row's scaled scores comes back with the output, so a caller can merge this attention
with attention computed elsewhere (:func:`merge`).

How it is computed. Query heads are grouped by the kv-head they read, so one batched
matmul per key block serves a whole GQA group without copying K or V per query head
(``[G, R, D] @ [G, D, C]``, ``R`` = query rows of a group). Scores are produced one key
block at a time and folded into a running (max, sum, output) accumulator: the online
softmax of FlashAttention. When all scores fit in :data:`MAX_SCORE_BYTES` this is a
single block, i.e. the plain two-pass softmax; past it, memory stays bounded by the
block size however long the prefix is. Every step is fp32; the running max makes
``exp`` never overflow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from pion.attend.widen import widen

__all__ = ["MAX_SCORE_BYTES", "Attention", "Selector", "attend", "merge", "select_blocks"]

F32 = npt.NDArray[np.float32]
Index = npt.NDArray[np.intp]

# The most score bytes ([groups, rows, keys] fp32) materialised at once. 32 MiB keeps a
# 2048-token prefix with 32 query heads and M = 64 in one block, and bounds a 128k-token
# prefix at 128 blocks of that size instead of a 1 GiB score matrix.
MAX_SCORE_BYTES = 32 << 20

# fp16 prefixes (slots that hold the V-store's fp16 rows) are widened to fp32 one key
# block at a time; a block's widened K (and V) stays within this many bytes, so the
# matmuls read it from cache right after the widening wrote it.
WIDEN_BYTES = 512 << 10

Selector = Literal["block_mean", "quest"]
KV = npt.NDArray[np.float32] | npt.NDArray[np.float16]


@dataclass(frozen=True, slots=True)
class Attention:
    """``out`` ``[H_q, M, D]`` and ``lse`` ``[H_q, M]`` (logsumexp of scaled scores)."""

    out: F32
    lse: F32


def _groups(head_map: Index | None, h_q: int, h_kv: int) -> tuple[Index | None, bool]:
    """How query heads map onto kv-head groups: ``(order, uniform)``.

    ``order`` None: heads are already grouped (``h // (h_q // h_kv)``), so a reshape of
    the query is the grouping. Otherwise ``order`` sorts the query heads by kv-head;
    ``uniform`` says every kv-head is read by the same number of query heads (then the
    sorted query reshapes into groups). A non-uniform map gathers K/V per query head."""
    if h_q % h_kv:
        raise ValueError(f"H_q={h_q} is not a multiple of H_kv={h_kv}")
    rep = h_q // h_kv
    if head_map is None:
        return None, True
    if head_map.shape != (h_q,):
        raise ValueError(f"head_map has shape {head_map.shape}, want ({h_q},)")
    if head_map.size and (int(head_map.min()) < 0 or int(head_map.max()) >= h_kv):
        raise ValueError(f"head_map values must be in 0..{h_kv - 1}")
    standard = np.arange(h_q, dtype=np.intp) // rep
    if np.array_equal(head_map, standard):
        return None, True
    order = np.argsort(head_map, kind="stable")
    uniform = bool((np.bincount(head_map, minlength=h_kv) == rep).all())
    return order, uniform


class _Online:
    """The running softmax of one attention call: row max ``m``, row sum ``l`` and the
    unnormalised output ``o``; :meth:`add` folds in one block of scores."""

    def __init__(self, groups: int, rows: int, d: int) -> None:
        self.m = np.full((groups, rows, 1), -np.inf, dtype=np.float32)
        self.l = np.zeros((groups, rows, 1), dtype=np.float32)
        self.o = np.zeros((groups, rows, d), dtype=np.float32)

    def add(self, s: F32, v: F32) -> None:
        """``s`` ``[G, R, C]`` scaled scores (masked entries ``-inf``), ``v`` ``[G, C, D]``."""
        m_new = np.maximum(self.m, s.max(axis=-1, keepdims=True))
        # A row that has seen no unmasked key yet keeps max -inf; shift it by 0 so
        # exp() gives 0 instead of exp(-inf - -inf) = nan.
        shift = np.where(np.isneginf(m_new), np.float32(0), m_new)
        alpha = np.exp(self.m - shift)
        np.subtract(s, shift, out=s)
        np.exp(s, out=s)
        self.l *= alpha
        self.l += s.sum(axis=-1, keepdims=True)
        self.o *= alpha
        self.o += np.matmul(s, v)
        self.m = m_new

    def result(self) -> tuple[F32, F32]:
        if not (self.l > 0).all():
            raise ValueError("a query row attended to no key")
        out = self.o / self.l
        lse = self.m + np.log(self.l)
        return out, lse[..., 0]


def _blocks(
    count: int, per_key_bytes: int, limit: int, cap: int | None = None
) -> Iterator[tuple[int, int]]:
    step = max(1, limit // max(1, per_key_bytes))
    if cap is not None:
        step = min(step, cap)
    for start in range(0, count, step):
        yield start, min(count, start + step)


def attend(
    q: F32,
    k: KV,
    v: KV,
    *,
    head_map: Index | None = None,
    window: int = 0,
    keys: Index | None = None,
    k_suf: F32 | None = None,
    v_suf: F32 | None = None,
    score_bytes: int = MAX_SCORE_BYTES,
) -> Attention:
    """Attention of ``q`` ``[H_q, M, D]`` over the prefix ``k``/``v`` ``[H_kv, N, D]``
    (and the suffix ``k_suf``/``v_suf`` ``[H_kv, S, D]`` when given).

    ``head_map[h]`` is the kv-head of query head ``h`` (None: ``h // (H_q // H_kv)``).
    ``window`` > 0 keeps the last ``window`` prefix tokens. ``keys`` restricts the
    prefix to those token indices (sorted, shared by every head). Inputs must be fp32;
    shapes are checked, values are the caller's to validate. ``k``/``v`` may be fp16
    (one dtype for both): each key block is widened to fp32 as it is used."""
    h_q, m_rows, d = q.shape
    h_kv, n, dk = k.shape
    if v.shape != k.shape or dk != d or v.dtype != k.dtype:
        raise ValueError(f"q {q.shape}, k {k.shape} and v {v.shape} do not agree")
    if n < 1 or m_rows < 1:
        raise ValueError("attention needs at least one prefix token and one query row")
    if k_suf is not None or v_suf is not None:
        if k_suf is None or v_suf is None or k_suf.shape != v_suf.shape:
            raise ValueError("k_suf and v_suf must both be given, with one shape")
        if k_suf.shape[0] != h_kv or k_suf.shape[2] != d:
            raise ValueError(f"suffix shape {k_suf.shape} does not match [{h_kv}, S, {d}]")
    order, uniform = _groups(head_map, h_q, h_kv)
    scale = np.float32(1.0 / np.sqrt(d))

    # Query rows grouped by the kv-head they read: qg [G, R, D].
    if order is None:
        qg = (q * scale).reshape(h_kv, (h_q // h_kv) * m_rows, d)
        gather: Index | None = None
    elif uniform:
        qg = (q[order] * scale).reshape(h_kv, (h_q // h_kv) * m_rows, d)
        gather = None
    else:
        # A map that reads kv-heads unevenly: K/V blocks are gathered per query head.
        qg = q * scale
        gather = order if head_map is None else head_map
    groups, rows = qg.shape[0], qg.shape[1]
    acc = _Online(groups, rows, d)
    kt_per_key = groups * rows * 4
    # An fp16 prefix: blocks small enough that their widened copy stays in cache.
    cap = max(1, WIDEN_BYTES // (h_kv * d * 4)) if k.dtype == np.float16 else None

    def take(src: KV, sel: slice | Index) -> F32:
        block = widen(src[:, sel])
        return block if gather is None else block[gather]

    # The prefix: a window of the last tokens, or a token subset.
    start = max(0, n - window) if window > 0 else 0
    prefix_keys: slice | Index
    if keys is not None:
        picked = keys[keys >= start] if start else keys
        for b0, b1 in _blocks(len(picked), kt_per_key, score_bytes, cap):
            sel = picked[b0:b1]
            acc.add(np.matmul(qg, take(k, sel).transpose(0, 2, 1)), take(v, sel))
    else:
        for b0, b1 in _blocks(n - start, kt_per_key, score_bytes, cap):
            prefix_keys = slice(start + b0, start + b1)
            kb = take(k, prefix_keys)
            acc.add(np.matmul(qg, kb.transpose(0, 2, 1)), take(v, prefix_keys))

    # The suffix, causal: query row m (row r of a group is m = r % M) sees suffix keys
    # 0 .. S - M + m.
    if k_suf is not None and v_suf is not None and k_suf.shape[1] > 0:
        s_len = k_suf.shape[1]
        last_visible = (np.arange(rows) % m_rows) + (s_len - m_rows)
        for b0, b1 in _blocks(s_len, kt_per_key, score_bytes):
            cols = np.arange(b0, b1)
            bias = np.where(cols[None, :] <= last_visible[:, None], 0.0, -np.inf)
            s = np.matmul(qg, take(k_suf, slice(b0, b1)).transpose(0, 2, 1))
            s += bias.astype(np.float32)
            acc.add(s, take(v_suf, slice(b0, b1)))

    out_g, lse_g = acc.result()
    out = out_g.reshape(h_q, m_rows, d) if gather is None else out_g
    lse = lse_g.reshape(h_q, m_rows) if gather is None else lse_g
    if order is not None and gather is None:
        unsorted_out = np.empty_like(out)
        unsorted_lse = np.empty_like(lse)
        unsorted_out[order] = out
        unsorted_lse[order] = lse
        out, lse = unsorted_out, unsorted_lse
    return Attention(np.ascontiguousarray(out), np.ascontiguousarray(lse))


def merge(a: Attention, b: Attention) -> Attention:
    """The attention over the union of two disjoint key sets, from each set's output
    and LSE (the identity the LSE trailer of ``QUERY`` exists for)."""
    lse = np.logaddexp(a.lse, b.lse)
    wa = np.exp(a.lse - lse)[..., None]
    wb = np.exp(b.lse - lse)[..., None]
    return Attention((a.out * wa + b.out * wb).astype(np.float32), lse.astype(np.float32))


def select_blocks(
    q: F32,
    k: KV,
    *,
    head_map: Index | None,
    block: int,
    top: int,
    selector: Selector = "block_mean",
    score_bytes: int = MAX_SCORE_BYTES,
) -> Index:
    """The prefix tokens a sparse query attends to, shared by every query head.

    The prefix is cut into blocks of ``block`` tokens (the last may be partial). A
    block's score is the mean over query heads of ``q[h] . summary[head_map[h], b] /
    sqrt(D)``; the summary is the block's mean key (``block_mean``) or, for ``quest``,
    the per-dimension key min/max, scored as ``sum_d max(q_d min_d, q_d max_d)``. The
    ``top`` best blocks (ties to the earlier block) are kept, and the last block always
    is (recent tokens). ``q`` is ``[H_q, D]`` (M = 1). Returns sorted token indices.

    Summaries are computed a run of blocks at a time, so the temporaries stay within
    ``score_bytes`` however long the prefix and however small the blocks."""
    h_q, d = q.shape
    h_kv, n, _ = k.shape
    if block < 1 or top < 1:
        raise ValueError("block and top must be >= 1")
    if selector not in ("block_mean", "quest"):
        raise ValueError(f"unknown selector {selector!r}")
    block = min(block, n)  # a block past the prefix is the whole prefix
    hm = np.arange(h_q, dtype=np.intp) // (h_q // h_kv) if head_map is None else head_map
    n_blocks = -(-n // block)
    qs = q * np.float32(1.0 / np.sqrt(d))
    # Block-mean is linear in q: the query heads of one kv-head add up first.
    q_group = np.zeros((h_kv, d), dtype=np.float32)
    np.add.at(q_group, hm, qs)
    scores = np.empty(n_blocks, dtype=np.float32)
    per_block = 3 * h_q * d * 4 if selector == "quest" else 2 * h_kv * d * 4
    step = max(1, score_bytes // per_block)
    for b0 in range(0, n_blocks, step):
        b1 = min(n_blocks, b0 + step)
        seg = k[:, b0 * block : min(n, b1 * block)]
        starts = np.arange(b1 - b0, dtype=np.intp) * block
        if selector == "block_mean":
            counts = np.minimum(block, seg.shape[1] - starts).astype(np.float32)
            # Sums in fp32 whatever k holds (an fp16 slot summed in fp16 would overflow).
            sums = np.add.reduceat(seg, starts, axis=1, dtype=np.float32)
            means = sums / counts[None, :, None]
            scores[b0:b1] = np.einsum("gd,gbd->b", q_group, means)
        else:
            # min/max are exact in fp16; only their results are widened.
            lo = widen(np.minimum.reduceat(seg, starts, axis=1))[hm]
            hi = widen(np.maximum.reduceat(seg, starts, axis=1))[hm]
            qb = qs[:, None, :]
            scores[b0:b1] = np.maximum(qb * lo, qb * hi).sum(axis=(0, 2))
    scores /= h_q
    chosen = np.zeros(n_blocks, dtype=bool)
    chosen[np.argsort(-scores, kind="stable")[: min(top, n_blocks)]] = True
    chosen[-1] = True
    return np.flatnonzero(np.repeat(chosen, block)[:n])
