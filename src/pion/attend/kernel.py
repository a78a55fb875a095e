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

Scores that overflow fp32. Finite fp32 inputs can still give a score past fp32's range
(K rows of 1e20 and a query of 1e20s: ``q . k`` is 4e40), and then the fp32 pass
yields ``inf - inf`` and rows that attended to nothing. The fp32 pass notices (a row max
that is not below ``+inf``, a row with no mass, a non-finite output) and the call is
computed again in float64, where no score of finite fp32 inputs can overflow
(``|q . k| <= D * FLT_MAX**2``, about 1e81 for the largest D, far below 1e308). The
output is a convex combination of V rows, so it always fits fp32 again; the LSE need
not, and comes back as ``inf`` for the caller that returns it to refuse
(:func:`pion.attend.queries.query`). The ordinary case pays one comparison per block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from pion.attend.widen import widen

# fp16 prefixes (slots that hold the V-store's fp16 rows) are widened to fp32 one key
# block at a time; a block's widened K (and V) stays within this many bytes, so the
# matmuls read it from cache right after the widening wrote it.
WIDEN_BYTES = 512 << 10

__all__ = ["MAX_SCORE_BYTES", "Attention", "Selector", "attend", "merge", "select_blocks"]

F32 = npt.NDArray[np.float32]
KV = npt.NDArray[np.float32] | npt.NDArray[np.float16]
Index = npt.NDArray[np.intp]
# fp32, or float64 in the pass after an overflow.
Arr = npt.NDArray[np.floating[Any]]

# The most score bytes ([groups, rows, keys] fp32) materialised at once. 32 MiB keeps a
# 2048-token prefix with 32 query heads and M = 64 in one block, and bounds a 128k-token
# prefix at 128 blocks of that size instead of a 1 GiB score matrix.
MAX_SCORE_BYTES = 32 << 20

Selector = Literal["block_mean", "quest"]


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
    unnormalised output ``o``; :meth:`add` folds in one block of scores. ``dtype`` is
    fp32, or float64 for the second pass after an overflow."""

    def __init__(self, groups: int, rows: int, d: int, dtype: type[np.floating[Any]]) -> None:
        self.m: Arr = np.full((groups, rows, 1), -np.inf, dtype=dtype)
        self.l: Arr = np.zeros((groups, rows, 1), dtype=dtype)
        self.o: Arr = np.zeros((groups, rows, d), dtype=dtype)

    def add(self, s: Arr, v: Arr) -> bool:
        """``s`` ``[G, R, C]`` scaled scores (masked entries ``-inf``), ``v`` ``[G, C, D]``.
        False when a score overflowed (a row max of ``+inf`` or NaN): the sums are then
        meaningless and the caller starts over in float64."""
        m_new = np.maximum(self.m, s.max(axis=-1, keepdims=True))
        if not bool((m_new < np.inf).all()):  # +inf and NaN compare False
            return False
        # A row that has seen no unmasked key yet keeps max -inf; shift it by 0 so
        # exp() gives 0 instead of exp(-inf - -inf) = nan.
        shift = np.where(np.isneginf(m_new), 0, m_new).astype(s.dtype)
        alpha = np.exp(self.m - shift)
        np.subtract(s, shift, out=s)
        np.exp(s, out=s)
        self.l *= alpha
        self.l += s.sum(axis=-1, keepdims=True)
        self.o *= alpha
        self.o += np.matmul(s, v)
        self.m = m_new
        return True

    def result(self) -> tuple[Arr, Arr] | None:
        """``(out, lse)``, or None when a row attended to no key (every score of it
        overflowed to ``-inf``) or the output is not finite (the unnormalised sum of
        huge V rows overflowed)."""
        if not (self.l > 0).all():
            return None
        out = self.o / self.l
        if not np.isfinite(out).all():
            return None
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
    shapes are checked, values are the caller's to validate. Scores past fp32's range
    are computed again in float64 (module docstring); the output is always finite, the
    LSE is ``inf`` where the float64 one does not fit fp32. ``k``/``v`` may be fp16 (one
    dtype for both): each key block is widened as it is used."""
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
    call = _Call(q, k, v, order, uniform, head_map, window, keys, k_suf, v_suf, score_bytes)
    # Overflow in the fp32 pass is expected and handled: no warnings from it.
    with np.errstate(over="ignore", invalid="ignore"):
        got = call.run(np.float32)
    if got is None:
        got = call.run(np.float64)
        if got is None:  # cannot happen for finite inputs (module docstring)
            raise ValueError("a query row attended to no key")
    out_g, lse_g = got
    with np.errstate(over="ignore"):  # an LSE past fp32 becomes inf, for the caller
        out_g, lse_g = out_g.astype(np.float32, copy=False), lse_g.astype(np.float32, copy=False)
    gather = call.gather
    out = out_g.reshape(h_q, m_rows, d) if gather is None else out_g
    lse = lse_g.reshape(h_q, m_rows) if gather is None else lse_g
    if order is not None and gather is None:
        unsorted_out = np.empty_like(out)
        unsorted_lse = np.empty_like(lse)
        unsorted_out[order] = out
        unsorted_lse[order] = lse
        out, lse = unsorted_out, unsorted_lse
    return Attention(np.ascontiguousarray(out), np.ascontiguousarray(lse))


@dataclass(slots=True)
class _Call:
    """One :func:`attend` call, runnable in fp32 and, after an overflow, in float64."""

    q: F32
    k: KV
    v: KV
    order: Index | None
    uniform: bool
    head_map: Index | None
    window: int
    keys: Index | None
    k_suf: F32 | None
    v_suf: F32 | None
    score_bytes: int
    gather: Index | None = None

    def run(self, dtype: type[np.floating[Any]]) -> tuple[Arr, Arr] | None:
        """``(out, lse)`` grouped ``[G, R, D]`` / ``[G, R]`` in ``dtype``, or None when a
        score overflowed ``dtype``."""
        q, k, order = self.q, self.k, self.order
        h_q, m_rows, d = q.shape
        h_kv, n, _ = k.shape
        scale = dtype(1.0 / np.sqrt(d))
        wide = q.astype(dtype, copy=False)
        # Query rows grouped by the kv-head they read: qg [G, R, D].
        if order is None:
            qg = (wide * scale).reshape(h_kv, (h_q // h_kv) * m_rows, d)
            self.gather = None
        elif self.uniform:
            qg = (wide[order] * scale).reshape(h_kv, (h_q // h_kv) * m_rows, d)
            self.gather = None
        else:
            # A map that reads kv-heads unevenly: K/V blocks are gathered per query head.
            qg = wide * scale
            self.gather = order if self.head_map is None else self.head_map
        gather = self.gather
        groups, rows = qg.shape[0], qg.shape[1]
        acc = _Online(groups, rows, d, dtype)
        kt_per_key = groups * rows * np.dtype(dtype).itemsize
        # An fp16 prefix: blocks small enough that their widened copy stays in cache.
        cap = max(1, WIDEN_BYTES // (h_kv * d * 4)) if k.dtype == np.float16 else None

        def take(src: KV, sel: slice | Index) -> Arr:
            block = widen(src[:, sel])
            block = block if gather is None else block[gather]
            return block.astype(dtype, copy=False)

        # The prefix: a window of the last tokens, or a token subset.
        start = max(0, n - self.window) if self.window > 0 else 0
        prefix_keys: slice | Index
        if self.keys is not None:
            picked = self.keys[self.keys >= start] if start else self.keys
            for b0, b1 in _blocks(len(picked), kt_per_key, self.score_bytes, cap):
                sel = picked[b0:b1]
                if not acc.add(np.matmul(qg, take(k, sel).transpose(0, 2, 1)), take(self.v, sel)):
                    return None
        else:
            for b0, b1 in _blocks(n - start, kt_per_key, self.score_bytes, cap):
                prefix_keys = slice(start + b0, start + b1)
                kb = take(k, prefix_keys)
                if not acc.add(np.matmul(qg, kb.transpose(0, 2, 1)), take(self.v, prefix_keys)):
                    return None

        # The suffix, causal: query row m (row r of a group is m = r % M) sees suffix
        # keys 0 .. S - M + m.
        k_suf, v_suf = self.k_suf, self.v_suf
        if k_suf is not None and v_suf is not None and k_suf.shape[1] > 0:
            s_len = k_suf.shape[1]
            last_visible = (np.arange(rows) % m_rows) + (s_len - m_rows)
            for b0, b1 in _blocks(s_len, kt_per_key, self.score_bytes):
                cols = np.arange(b0, b1)
                bias = np.where(cols[None, :] <= last_visible[:, None], 0.0, -np.inf)
                s = np.matmul(qg, take(k_suf, slice(b0, b1)).transpose(0, 2, 1))
                s += bias.astype(dtype)
                if not acc.add(s, take(v_suf, slice(b0, b1))):
                    return None
        return acc.result()


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
    h_q = q.shape[0]
    h_kv, n, _ = k.shape
    if block < 1 or top < 1:
        raise ValueError("block and top must be >= 1")
    if selector not in ("block_mean", "quest"):
        raise ValueError(f"unknown selector {selector!r}")
    block = min(block, n)  # a block past the prefix is the whole prefix
    hm = np.arange(h_q, dtype=np.intp) // (h_q // h_kv) if head_map is None else head_map
    shape = (h_kv, n, block, -(-n // block))
    # Block scores past fp32's range (huge K or Q) are scored again in float64, as in
    # attend(): the selection then follows the true scores instead of NaN.
    with np.errstate(over="ignore", invalid="ignore"):
        scores = _block_scores(
            q, k, hm, shape, selector=selector, score_bytes=score_bytes, dtype=np.float32
        )
    if not np.isfinite(scores).all():
        scores = _block_scores(
            q, k, hm, shape, selector=selector, score_bytes=score_bytes, dtype=np.float64
        )
    n_blocks = shape[3]
    scores /= h_q
    chosen = np.zeros(n_blocks, dtype=bool)
    chosen[np.argsort(-scores, kind="stable")[: min(top, n_blocks)]] = True
    chosen[-1] = True
    return np.flatnonzero(np.repeat(chosen, block)[:n])


def _block_scores(
    q: F32,
    k: KV,
    hm: Index,
    shape: tuple[int, int, int, int],
    *,
    selector: Selector,
    score_bytes: int,
    dtype: type[np.floating[Any]],
) -> Arr:
    """The score of each block (summed over query heads), computed in ``dtype``."""
    h_q, d = q.shape
    h_kv, n, block, n_blocks = shape
    qs = q.astype(dtype, copy=False) * dtype(1.0 / np.sqrt(d))
    # Block-mean is linear in q: the query heads of one kv-head add up first.
    q_group = np.zeros((h_kv, d), dtype=dtype)
    np.add.at(q_group, hm, qs)
    scores = np.empty(n_blocks, dtype=dtype)
    itemsize = np.dtype(dtype).itemsize
    per_block = 3 * h_q * d * itemsize if selector == "quest" else 2 * h_kv * d * itemsize
    step = max(1, score_bytes // per_block)
    for b0 in range(0, n_blocks, step):
        b1 = min(n_blocks, b0 + step)
        seg = k[:, b0 * block : min(n, b1 * block)].astype(dtype, copy=False)
        starts = np.arange(b1 - b0, dtype=np.intp) * block
        if selector == "block_mean":
            counts = np.minimum(block, seg.shape[1] - starts).astype(dtype)
            means = np.add.reduceat(seg, starts, axis=1) / counts[None, :, None]
            scores[b0:b1] = np.einsum("gd,gbd->b", q_group, means)
        else:
            lo = np.minimum.reduceat(seg, starts, axis=1)[hm]
            hi = np.maximum.reduceat(seg, starts, axis=1)[hm]
            qb = qs[:, None, :]
            scores[b0:b1] = np.maximum(qb * lo, qb * hi).sum(axis=(0, 2))
    return scores
