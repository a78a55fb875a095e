"""KV.PREFIX.WARM by reference (``pion.attend.warm``) and the kernel's fp16 prefixes.

fp16 layers become slots that are the V-store's own rows (no fp32 copy, 2 bytes per
value in the byte budget), keep the rows they were warmed with when the V-store's rows
are overwritten afterwards, and answer every query form as a widened fp32 copy would;
other formats are decoded once into fp32.
"""

from __future__ import annotations

import numpy as np
import pytest

from pion.attend import kernel
from pion.attend.kernel import attend, select_blocks
from pion.attend.tables import AttentionTables
from pion.attend.warm import warm
from pion.attend.widen import widen
from pion.config import VStoreLimits
from pion.errors import OOMError
from pion.vstore import VStore
from support.attend import reference

H, N, D = 4, 300, 16
RNG = np.random.default_rng(24)
ATOL = 2e-5


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def namespace(vs: VStore, fmts: tuple[str, str] = ("fp16", "fp16"), layers: int = 2) -> None:
    for half, fmt in zip((b"k", b"v"), fmts, strict=True):
        vs.create(half, H * D, fmt)
        for layer in range(layers):
            vs.store(half, layer, 0, rand(N, H * D))


def heads_first(rows: np.ndarray) -> np.ndarray:
    return rows.reshape(-1, H, D).transpose(1, 0, 2)


def stored(vs: VStore, sid: bytes, layer: int) -> np.ndarray:
    rows = vs.fetch_range(sid, layer, 0, N)
    assert rows is not None
    return heads_first(np.array(rows, dtype=np.float32))


def test_fp16_slots_are_the_vstores_rows() -> None:
    vs, tables = VStore(VStoreLimits()), AttentionTables()
    namespace(vs)
    assert warm(vs, tables, (b"k", b"v"), h=H, d=D, attend_sid=b"a") == (2, 0)
    for layer in range(2):
        slot = tables.get((b"a", layer))
        assert slot is not None
        assert slot.k.dtype == slot.v.dtype == np.float16
        assert slot.k.shape == (H, N, D)
        native = vs.fetch_range(b"k", layer, 0, N, native=True)
        assert native is not None and np.shares_memory(slot.k, native)
    # Two layers, K and V, 2 bytes a value: no fp32 copy anywhere.
    assert tables.bytes == 2 * 2 * H * N * D * 2


def test_a_budget_that_holds_fp16_but_not_fp32_takes_the_warm() -> None:
    vs = VStore(VStoreLimits())
    namespace(vs, layers=1)
    tables = AttentionTables(max_bytes=2 * H * N * D * 2)  # one fp16 slot, half an fp32 one
    assert warm(vs, tables, (b"k", b"v"), h=H, d=D, attend_sid=b"a") == (1, 0)
    small = AttentionTables(max_bytes=2 * H * N * D * 2 - 1)
    with pytest.raises(OOMError, match="exceed attend-maxmemory"):
        warm(vs, small, (b"k", b"v"), h=H, d=D, attend_sid=b"a")
    assert small.warm_count == 0


def test_a_later_overwrite_leaves_the_warm_slot_as_it_was() -> None:
    vs, tables = VStore(VStoreLimits()), AttentionTables()
    namespace(vs, layers=1)
    before = stored(vs, b"k", 0)
    warm(vs, tables, (b"k", b"v"), h=H, d=D, attend_sid=b"a")
    vs.store(b"k", 0, 0, rand(N, H * D))  # same rows, new values
    vs.store(b"k", 0, N, rand(10, H * D))  # and an append
    slot = tables.get((b"a", 0))
    assert slot is not None
    np.testing.assert_array_equal(slot.k.astype(np.float32), before)
    assert not np.array_equal(stored(vs, b"k", 0), before)


@pytest.mark.parametrize("fmts", [("int8", "int8"), ("fp16", "turbo4"), ("fp8", "fp16")])
def test_other_formats_are_decoded_once_into_fp32(fmts: tuple[str, str]) -> None:
    vs, tables = VStore(VStoreLimits()), AttentionTables()
    namespace(vs, fmts, layers=1)
    warm(vs, tables, (b"k", b"v"), h=H, d=D, attend_sid=b"a")
    slot = tables.get((b"a", 0))
    assert slot is not None
    assert slot.k.dtype == slot.v.dtype == np.float32
    np.testing.assert_array_equal(slot.k, stored(vs, b"k", 0))
    np.testing.assert_array_equal(slot.v, stored(vs, b"v", 0))
    assert tables.bytes == 2 * H * N * D * 4


def test_warm_queries_match_the_reference() -> None:
    vs, tables = VStore(VStoreLimits()), AttentionTables()
    namespace(vs)
    warm(vs, tables, (b"k", b"v"), h=H, d=D, attend_sid=b"a")
    slot = tables.get((b"a", 1))
    assert slot is not None
    k, v = stored(vs, b"k", 1), stored(vs, b"v", 1)
    for m in (1, 5):
        q = rand(H, m, D)
        got = attend(q, slot.k, slot.v)
        out, lse = reference(q, k, v)
        np.testing.assert_allclose(got.out, out, atol=ATOL)
        np.testing.assert_allclose(got.lse, lse, atol=ATOL)


# -- the kernel on fp16 prefixes -------------------------------------------------------


def fp16_prefix(h: int, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V as WARM holds them: [H, N, D] views of token-major fp16 rows."""
    k, v = (
        (rand(n, h * d) * 3).astype(np.float16).reshape(n, h, d).transpose(1, 0, 2)
        for _ in range(2)
    )
    return k, v


@pytest.mark.parametrize("widen_bytes", [1, 4096, 1 << 20])
@pytest.mark.parametrize(
    ("h_q", "h_kv", "head_map"),
    [(8, 8, None), (8, 2, None), (8, 2, [1, 0, 1, 0, 1, 0, 1, 0]), (4, 2, [0, 0, 0, 1])],
)
def test_fp16_prefixes_attend_like_their_fp32_widening(
    monkeypatch: pytest.MonkeyPatch, widen_bytes: int, h_q: int, h_kv: int, head_map: list[int]
) -> None:
    monkeypatch.setattr(kernel, "WIDEN_BYTES", widen_bytes)
    k16, v16 = fp16_prefix(h_kv, 97, D)
    k32, v32 = k16.astype(np.float32), v16.astype(np.float32)
    hm = None if head_map is None else np.asarray(head_map, dtype=np.intp)
    ks, vs = rand(h_kv, 3, D), rand(h_kv, 3, D)
    keys = np.array([0, 5, 6, 40, 96], dtype=np.intp)
    for m in (1, 3):
        q = rand(h_q, m, D)
        for extra in ({}, {"window": 20}, {"keys": keys}, {"k_suf": ks, "v_suf": vs}):
            want = attend(q, k32, v32, head_map=hm, **extra)  # type: ignore[arg-type]
            got = attend(q, k16, v16, head_map=hm, **extra)  # type: ignore[arg-type]
            np.testing.assert_allclose(got.out, want.out, atol=ATOL)
            np.testing.assert_allclose(got.lse, want.lse, atol=ATOL)


@pytest.mark.parametrize("selector", ["block_mean", "quest"])
def test_sparse_selection_over_fp16_sums_in_fp32(selector: str) -> None:
    # Values near fp16's top: a block sum in fp16 would overflow to inf.
    k16 = np.full((2, 64, D), 60000, dtype=np.float16)
    k16[:, 16:32] = -60000
    q = np.ones((2, D), dtype=np.float32)
    got = select_blocks(q, k16, head_map=None, block=16, top=1, selector=selector)  # type: ignore[arg-type]
    want = select_blocks(
        q, k16.astype(np.float32), head_map=None, block=16, top=1, selector=selector
    )  # type: ignore[arg-type]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.r_[0:16, 48:64])


def test_widen_is_exact_for_every_half_and_any_layout() -> None:
    every = np.arange(65536, dtype=np.uint16).view(np.float16)
    rows = every.reshape(1024, 4, 16)  # token-major
    block = rows.transpose(1, 0, 2)  # as a slot sees it: contiguous transpose
    want = block.astype(np.float32)
    np.testing.assert_array_equal(widen(block).view(np.uint32), want.view(np.uint32))
    sliced = block[:, 3:900:2]  # not contiguous: numpy's cast
    np.testing.assert_array_equal(
        widen(sliced).view(np.uint32), sliced.astype(np.float32).view(np.uint32)
    )
    f32 = rand(2, 3, 4)
    assert widen(f32) is f32
