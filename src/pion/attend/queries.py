"""The attention tier's operations, validated: what ``ATTEND.PREFIX.*`` does once its
arguments are parsed, shared by the RESP commands and the binary lane.

Every function here checks everything it is given (ranges, blob sizes against the
declared shape, finiteness, the slot's state and shape) before it reads or changes a
slot, and reports a failure as a :class:`~pion.errors.PionError` whose text is the
wire's. ``cmd`` is the command name the errors carry. Blobs are little-endian fp32
arrays without a header (docs/protocol.md, wire conventions), viewed in place, never copied.

Errors that clients match on: ``-COLDMISS session evicted to cold tier (call
KV.PREFIX.WARM)`` for a COLD slot; ``<cmd> failed (session not found, or unsupported
D)`` for a MISSING one (Pion's text); ``blob size`` in every size mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pion.attend.kernel import Attention, Selector, attend, select_blocks
from pion.attend.tables import AttentionTables, Key, Slot
from pion.errors import ColdMissError, PionError

__all__ = [
    "COLDMISS_MESSAGE",
    "MAX_HEADS",
    "MAX_HEAD_DIM",
    "MAX_LAYER",
    "SELECTORS",
    "FusedQuery",
    "PrefixQuery",
    "SparseQuery",
    "StoreRequest",
    "check_heads",
    "f32_blob",
    "query",
    "query_fused",
    "query_sparse",
    "store",
]

# head_map entries are u8 on the wire, so at most 256 kv-heads; query heads share the
# bound (the largest published models have 128).
MAX_HEADS = 256
# The V-store's largest row (kv_dim 8192): any layer it holds can be warmed with H=1.
# Pion allows a fixed set of D; any D the math allows is fine here.
MAX_HEAD_DIM = 8192
# Layer ids are u16 on the binary lane.
MAX_LAYER = 65535
# selector_id of the sparse queries: 0 block-mean (default), 1 Quest's upper bound.
SELECTORS: dict[int, Selector] = {0: "block_mean", 1: "quest"}

COLDMISS_MESSAGE = "session evicted to cold tier (call KV.PREFIX.WARM)"

Buffer = bytes | bytearray | memoryview
F32 = npt.NDArray[np.float32]


def f32_blob(buf: Buffer, shape: tuple[int, ...], what: str, cmd: str) -> F32:
    """``buf`` viewed as a finite fp32 array of ``shape``; its size was checked."""
    arr = np.frombuffer(buf, dtype="<f4").reshape(shape)
    if not np.isfinite(arr).all():
        raise PionError(f"{cmd}: {what} holds non-finite values (NaN or inf)")
    return arr


def _size(buf: Buffer) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def check_heads(cmd: str, h: int, d: int, what: str = "H") -> None:
    if not 1 <= h <= MAX_HEADS or not 1 <= d <= MAX_HEAD_DIM:
        raise PionError(f"{cmd}: invalid {what}/D (1..{MAX_HEADS} / 1..{MAX_HEAD_DIM})")


def _rows(cmd: str, q: Buffer, h: int, d: int, what: str) -> int:
    """M, the query rows in ``q``: its size must be a positive multiple of h*d*4."""
    per_row = h * d * 4
    size = _size(q)
    if size == 0 or size % per_row:
        raise PionError(
            f"{cmd}: Q blob size {size} is not a positive multiple of {what}*D*4 = {per_row}"
        )
    return size // per_row


def _window(cmd: str, fa_window: int, default: int) -> int:
    if fa_window < -1:
        raise PionError(f"{cmd}: fa_window must be >= -1 (-1 = server default, 0 = full)")
    return default if fa_window == -1 else fa_window


def _head_map(
    cmd: str, raw: Buffer, h_q: int, h_kv: int, *, empty_ok: bool
) -> npt.NDArray[np.intp]:
    size = _size(raw)
    if size == 0 and empty_ok:
        return np.arange(h_q, dtype=np.intp) // (h_q // h_kv)
    if size != h_q:
        want = f"0 (identity) or H_q = {h_q}" if empty_ok else f"H_q = {h_q}"
        raise PionError(f"{cmd}: head_map blob size {size} != {want}")
    hm = np.frombuffer(raw, dtype=np.uint8).astype(np.intp)
    if int(hm.max()) >= h_kv:
        raise PionError(
            f"{cmd}: head_map value {int(hm.max())} out of range (each < H_kv = {h_kv})"
        )
    return hm


def _suffix(cmd: str, k_suf: Buffer, v_suf: Buffer, shape: tuple[int, int, int]) -> tuple[F32, F32]:
    h_kv, s_suf, d = shape
    want = h_kv * s_suf * d * 4
    if _size(k_suf) != want or _size(v_suf) != want:
        raise PionError(
            f"{cmd}: K_suf/V_suf blob size {_size(k_suf)}/{_size(v_suf)} != expected "
            f"H_kv*S_suf*D*4 = {want} each"
        )
    return f32_blob(k_suf, shape, "K_suf", cmd), f32_blob(v_suf, shape, "V_suf", cmd)


def _slot(tables: AttentionTables, cmd: str, key: Key, h: int, d: int) -> Slot:
    """The WARM slot, stamped most recent; COLDMISS or session-not-found otherwise, and
    an error naming both shapes when the query's H/D do not match the stored ones."""
    slot = tables.get(key)
    if slot is None:
        if tables.cold_entry(key) is not None:
            raise ColdMissError(COLDMISS_MESSAGE)
        raise PionError(f"{cmd} failed (session not found, or unsupported D)")
    if slot.heads != h or slot.head_dim != d:
        raise PionError(
            f"{cmd}: the query's H={h}, D={d} do not match the stored layer "
            f"(H={slot.heads}, D={slot.head_dim})"
        )
    return slot


@dataclass(frozen=True, slots=True)
class StoreRequest:
    """ATTEND.PREFIX.STORE, parsed: K and V ``[H, N, D]``."""

    sid: bytes
    layer: int
    h: int
    n: int
    d: int
    k: Buffer
    v: Buffer


def store(tables: AttentionTables, cmd: str, req: StoreRequest) -> None:
    """``(sid, layer)`` becomes WARM with K/V ``[H, N, D]`` (stamped most recent)."""
    check_heads(cmd, req.h, req.d)
    if req.n < 1:
        raise PionError(f"{cmd}: invalid N (must be >= 1)")
    want = req.h * req.n * req.d * 4
    if _size(req.k) != want or _size(req.v) != want:
        raise PionError(
            f"{cmd}: K/V blob size {_size(req.k)}/{_size(req.v)} != expected H*N*D*4 = {want} each"
        )
    tables.check_fits(2 * want)
    shape = (req.h, req.n, req.d)
    k, v = f32_blob(req.k, shape, "K", cmd), f32_blob(req.v, shape, "V", cmd)
    tables.put((req.sid, req.layer), k, v)


@dataclass(frozen=True, slots=True)
class PrefixQuery:
    """ATTEND.PREFIX.QUERY, parsed: Q ``[H, M, D]`` (M from its size)."""

    sid: bytes
    layer: int
    h: int
    d: int
    q: Buffer
    fa_window: int = -1


def query(tables: AttentionTables, cmd: str, req: PrefixQuery, default_window: int) -> Attention:
    """Attention of Q over the whole prefix of the slot (H and D must match it)."""
    check_heads(cmd, req.h, req.d)
    m = _rows(cmd, req.q, req.h, req.d, "H")
    window = _window(cmd, req.fa_window, default_window)
    qa = f32_blob(req.q, (req.h, m, req.d), "Q", cmd)
    slot = _slot(tables, cmd, (req.sid, req.layer), req.h, req.d)
    result = attend(qa, slot.k, slot.v, window=window)
    # M > 1 replies carry the LSE in fp32: scores far past fp32's range (the kernel
    # computes them in float64) can give one that fp32 cannot hold.
    if m > 1 and not np.isfinite(result.lse).all():
        raise PionError(
            f"{cmd}: the log-sum-exp of the attention scores overflows fp32 "
            "(Q . K / sqrt(D) past 3.4e38); scale Q or K down, or query with M = 1"
        )
    return result


@dataclass(frozen=True, slots=True)
class FusedQuery:
    """ATTEND.PREFIX.QUERY_FUSED (RESP) and opcode 0x24 (binary lane), parsed."""

    sid: bytes
    layer: int
    h_q: int
    d: int
    s_suf: int
    h_kv: int
    q: Buffer
    k_suf: Buffer
    v_suf: Buffer
    head_map: Buffer
    fa_window: int = -1
    m: int | None = None  # the binary lane declares M; RESP derives it from Q


def _gqa(cmd: str, h_q: int, d: int, h_kv: int) -> None:
    check_heads(cmd, h_q, d, "H_q")
    check_heads(cmd, h_kv, d, "H_kv")
    if h_q % h_kv:
        raise PionError(f"{cmd}: H_q must be a multiple of H_kv (GQA): {h_q} % {h_kv} != 0")


def query_fused(tables: AttentionTables, cmd: str, req: FusedQuery, default_window: int) -> F32:
    """One softmax over the prefix of kv-head ``head_map[h]`` and the suffix, causal
    within the suffix. Returns ``[H_q, M, D]``."""
    _gqa(cmd, req.h_q, req.d, req.h_kv)
    if req.s_suf < 0:
        raise PionError(f"{cmd}: S_suf must be >= 0")
    m = _rows(cmd, req.q, req.h_q, req.d, "H_q")
    if req.m is not None and req.m != m:
        raise PionError(f"{cmd}: M={req.m} but Q holds {m} rows")
    window = _window(cmd, req.fa_window, default_window)
    k_suf, v_suf = _suffix(cmd, req.k_suf, req.v_suf, (req.h_kv, req.s_suf, req.d))
    hm = _head_map(cmd, req.head_map, req.h_q, req.h_kv, empty_ok=False)
    qa = f32_blob(req.q, (req.h_q, m, req.d), "Q", cmd)
    slot = _slot(tables, cmd, (req.sid, req.layer), req.h_kv, req.d)
    suffix = req.s_suf > 0
    return attend(
        qa,
        slot.k,
        slot.v,
        head_map=hm,
        window=window,
        k_suf=k_suf if suffix else None,
        v_suf=v_suf if suffix else None,
    ).out


@dataclass(frozen=True, slots=True)
class SparseQuery:
    """ATTEND.PREFIX.QUERY_SPARSE_AUTO[_FUSED], parsed (no suffix: S_suf 0, blobs empty)."""

    sid: bytes
    layer: int
    h_q: int
    d: int
    block: int
    top: int
    h_kv: int
    q: Buffer
    head_map: Buffer
    s_suf: int = 0
    k_suf: Buffer = b""
    v_suf: Buffer = b""
    fa_window: int = -1
    selector: int = 0


def query_sparse(tables: AttentionTables, cmd: str, req: SparseQuery, default_window: int) -> F32:
    """M = 1 attention over the blocks the selector picks (plus the last block, plus
    the suffix when given). Returns ``[H_q, D]``."""
    _gqa(cmd, req.h_q, req.d, req.h_kv)
    if req.block < 1 or req.top < 1:
        raise PionError(f"{cmd}: invalid B/K_top (must be > 0)")
    if req.s_suf < 0:
        raise PionError(f"{cmd}: S_suf must be >= 0")
    selector = SELECTORS.get(req.selector)
    if selector is None:
        raise PionError(f"{cmd}: selector_id must be 0 (block-mean) or 1 (Quest)")
    per_row = req.h_q * req.d * 4
    if _size(req.q) != per_row:
        raise PionError(f"{cmd}: Q blob size {_size(req.q)} != H_q*D*4 = {per_row} (M = 1)")
    window = _window(cmd, req.fa_window, default_window)
    k_suf, v_suf = _suffix(cmd, req.k_suf, req.v_suf, (req.h_kv, req.s_suf, req.d))
    hm = _head_map(cmd, req.head_map, req.h_q, req.h_kv, empty_ok=True)
    qa = f32_blob(req.q, (req.h_q, req.d), "Q", cmd)
    slot = _slot(tables, cmd, (req.sid, req.layer), req.h_kv, req.d)
    keys = select_blocks(qa, slot.k, head_map=hm, block=req.block, top=req.top, selector=selector)
    suffix = req.s_suf > 0
    out = attend(
        qa[:, None, :],
        slot.k,
        slot.v,
        head_map=hm,
        window=window,
        keys=keys,
        k_suf=k_suf if suffix else None,
        v_suf=v_suf if suffix else None,
    ).out
    return out[:, 0, :]
