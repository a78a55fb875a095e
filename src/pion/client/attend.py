"""The attention tier's fused and sparse queries as sans-IO plans (see :mod:`.plans`):
``ATTEND.PREFIX.QUERY_FUSED``, ``ATTEND.PREFIX.QUERY_SPARSE_AUTO`` and its ``_FUSED``
form, argument for argument as the server takes them (docs/protocol.md, "Attention
tier") and as Pion's client sends them.

Each checks shapes before anything is sent, sends fp32 blobs and ``head_map`` as u8,
and after ``-COLDMISS`` WARMs the namespace with ``H_kv`` heads and retries once, as
``attend_query`` does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from pion.client.errors import PionColdMiss, PionProtocolError
from pion.client.plans import Plan, check
from pion.client.wire import Command, attend_sid, int_arg, parse_warm
from pion.wire import bytes_of

__all__ = ["SELECTORS", "query_fused", "query_sparse"]

# selector_id on the wire: Pion's names (its client also takes "block-mean" and "").
SELECTORS = {"block_mean": 0, "block-mean": 0, "": 0, "quest": 1}

F32 = npt.NDArray[np.float32]


def _f32(array: npt.ArrayLike, ndim: int, what: str) -> F32:
    a = np.ascontiguousarray(array, dtype="<f4")
    if a.ndim != ndim:
        raise ValueError(f"{what}: expected {ndim} dimensions, got shape {list(a.shape)}")
    return a


def _blob(a: F32) -> memoryview | bytes:
    """``bytes_of``, or ``b""`` for an empty array (no S_suf rows: a view cannot be cast)."""
    return bytes_of(a) if a.size else b""


def _suffix(k_suf: npt.ArrayLike, v_suf: npt.ArrayLike, d: int) -> tuple[F32, F32]:
    k, v = _f32(k_suf, 3, "k_suf"), _f32(v_suf, 3, "v_suf")
    if k.shape != v.shape:
        raise ValueError(f"k_suf {list(k.shape)} and v_suf {list(v.shape)} differ")
    if k.shape[2] != d:
        raise ValueError(f"k_suf has D = {k.shape[2]}, the query D = {d}")
    return k, v


def _head_map(head_map: npt.ArrayLike | None, h_q: int, h_kv: int) -> bytes:
    """``head_map`` as u8 bytes; None: the standard GQA map ``h // (H_q // H_kv)``."""
    if h_kv < 1 or h_q % h_kv:
        raise ValueError(f"H_q = {h_q} must be a multiple of H_kv = {h_kv}")
    if head_map is None:
        return (np.arange(h_q) // (h_q // h_kv)).astype(np.uint8).tobytes()
    hm = np.asarray(head_map)
    if hm.shape != (h_q,):
        raise ValueError(f"head_map must have shape ({h_q},), got {list(hm.shape)}")
    if hm.size and (int(hm.min()) < 0 or int(hm.max()) >= h_kv):
        raise ValueError(f"head_map values must be in 0..{h_kv - 1}")
    return hm.astype(np.uint8).tobytes()


def _output(reply: object, shape: tuple[int, ...], cmd: str) -> F32:
    if not isinstance(reply, bytes):
        raise PionProtocolError(f"{cmd}: unexpected {type(reply).__name__}")
    want = int(np.prod(shape)) * 4
    if len(reply) != want:
        raise PionProtocolError(f"{cmd}: {len(reply)} bytes, want {want}")
    return np.frombuffer(reply, dtype="<f4").reshape(shape)


def _cold_retry(
    command: Command, ns: str, h_kv: int, d: int, on_rehydrate: Callable[[], None]
) -> Plan[object]:
    """Send ``command``; after ``-COLDMISS``: WARM with ``H_kv`` heads, retry once."""
    reply = (yield [command])[0]
    if isinstance(reply, PionColdMiss):
        on_rehydrate()
        (warmed,) = yield [("KV.PREFIX.WARM", ns, h_kv, d, attend_sid(ns))]
        if isinstance(warmed, BaseException):
            raise reply from warmed
        if parse_warm(warmed)[0] == 0:
            raise reply
        reply = (yield [command])[0]
    return check(reply)


def query_fused(
    ns: str,
    layer: int,
    q: npt.ArrayLike,
    suffix: tuple[npt.ArrayLike, npt.ArrayLike],
    *,
    head_map: npt.ArrayLike | None,
    fa_window: int | None,
    on_rehydrate: Callable[[], None],
) -> Plan[F32]:
    """ATTEND.PREFIX.QUERY_FUSED: ``q`` ``[H_q, M, D]`` over the prefix and the suffix
    ``(K, V)`` ``[H_kv, S_suf, D]`` (causal within it); returns ``[H_q, M, D]``."""
    query = _f32(q, 3, "q")
    h_q, _, d = query.shape
    k, v = _suffix(*suffix, d)
    h_kv, s_suf = int(k.shape[0]), int(k.shape[1])
    command: Command = (
        "ATTEND.PREFIX.QUERY_FUSED",
        attend_sid(ns),
        int_arg(layer, "layer"),
        h_q,
        d,
        s_suf,
        h_kv,
        bytes_of(query),
        _blob(k),
        _blob(v),
        _head_map(head_map, h_q, h_kv),
    )
    if fa_window is not None:
        command = (*command, int(fa_window))
    reply = yield from _cold_retry(command, ns, h_kv, d, on_rehydrate)
    return _output(reply, query.shape, "ATTEND.PREFIX.QUERY_FUSED")


def query_sparse(
    ns: str,
    layer: int,
    q: npt.ArrayLike,
    block: int,
    k_top: int,
    *,
    suffix: tuple[npt.ArrayLike, npt.ArrayLike] | None,
    h_kv: int | None,
    head_map: npt.ArrayLike | None,
    fa_window: int | None,
    selector: str,
    on_rehydrate: Callable[[], None],
) -> Plan[F32]:
    """ATTEND.PREFIX.QUERY_SPARSE_AUTO (``suffix`` None) or ``..._FUSED``: ``q``
    ``[H_q, D]`` (M = 1) over the ``k_top`` best blocks of ``block`` tokens (plus the
    last block, plus the suffix); returns ``[H_q, D]``."""
    query = _f32(q, 2, "q")
    h_q, d = (int(n) for n in query.shape)
    if selector not in SELECTORS:
        raise ValueError(f"unknown selector {selector!r}; expected 'block_mean' or 'quest'")
    suf = None if suffix is None else _suffix(*suffix, d)
    kv_heads = h_kv if h_kv is not None else (h_q if suf is None else int(suf[0].shape[0]))
    if suf is not None and suf[0].shape[0] != kv_heads:
        raise ValueError(f"k_suf has {suf[0].shape[0]} heads, H_kv = {kv_heads}")
    cmd = "ATTEND.PREFIX.QUERY_SPARSE_AUTO" + ("" if suf is None else "_FUSED")
    head = (cmd, attend_sid(ns), int_arg(layer, "layer"), h_q, d)
    counts = (int_arg(block, "block"), int_arg(k_top, "k_top"), kv_heads)
    hm = _head_map(head_map, h_q, kv_heads)
    if suf is None:
        command: Command = (*head, *counts, bytes_of(query), hm)
    else:
        k, v = suf
        command = (*head, *counts, int(k.shape[1]), bytes_of(query), _blob(k), _blob(v), hm)
    window = -1 if fa_window is None else int(fa_window)
    command = (*command, window, SELECTORS[selector])
    reply = yield from _cold_retry(command, ns, kv_heads, d, on_rehydrate)
    return _output(reply, (h_q, d), cmd)
