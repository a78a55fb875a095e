"""The numpy attention kernel against a float64 reference and against torch's
scaled_dot_product_attention: every query form, GQA ratios 1/2/4/8, M = 1 and M > 1,
fa_window, suffixes with S_suf = 0 and > 0, the online softmax across key blocks, the
sparse selectors, and the LSE merge identity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pion.attend.kernel import Attention, attend, merge, select_blocks
from support.attend import reference, reference_blocks

RNG = np.random.default_rng(11)
# fp32 against float64 on unit-normal data: errors are ~1e-7; 2e-5 leaves room for
# longer sums without hiding a real mistake (a wrong mask or scale is ~1e-1).
ATOL = 2e-5


def _normal(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _check(got: Attention, want: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_allclose(got.out, want[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got.lse, want[1], atol=ATOL, rtol=0)
    assert got.out.dtype == np.float32 and got.lse.dtype == np.float32


@pytest.mark.parametrize("m_rows", [1, 7])
@pytest.mark.parametrize("window", [0, 1, 30, 500])
def test_query_matches_reference(m_rows: int, window: int) -> None:
    q, k, v = _normal(4, m_rows, 32), _normal(4, 200, 32), _normal(4, 200, 32)
    _check(attend(q, k, v, window=window), reference(q, k, v, window=window))


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
@pytest.mark.parametrize("m_rows", [1, 5])
@pytest.mark.parametrize("s_suf", [0, 3, 9])
@pytest.mark.parametrize("window", [0, 17])
def test_fused_gqa_matches_reference(ratio: int, m_rows: int, s_suf: int, window: int) -> None:
    h_kv, n, d = 2, 90, 16
    h_q = h_kv * ratio
    q, k, v = _normal(h_q, m_rows, d), _normal(h_kv, n, d), _normal(h_kv, n, d)
    ks, vs = _normal(h_kv, s_suf, d), _normal(h_kv, s_suf, d)
    hm = np.arange(h_q) // ratio
    suffix = {"k_suf": ks, "v_suf": vs} if s_suf else {}
    got = attend(q, k, v, head_map=hm, window=window, **suffix)
    _check(got, reference(q, k, v, hm, window=window, **suffix))


@pytest.mark.parametrize("kind", ["permuted", "uneven"])
def test_fused_any_head_map(kind: str) -> None:
    """A head_map need not be h // ratio: permuted maps regroup the query heads, uneven
    ones (kv-heads read by different numbers of query heads) gather per head."""
    h_kv, h_q, d = 4, 16, 8
    hm = RNG.permutation(np.arange(h_q) // 4) if kind == "permuted" else RNG.integers(0, 3, h_q)
    q, k, v = _normal(h_q, 3, d), _normal(h_kv, 50, d), _normal(h_kv, 50, d)
    ks, vs = _normal(h_kv, 4, d), _normal(h_kv, 4, d)
    got = attend(q, k, v, head_map=hm, k_suf=ks, v_suf=vs)
    _check(got, reference(q, k, v, hm, k_suf=ks, v_suf=vs))


def test_causal_suffix_shorter_than_the_queries() -> None:
    """S_suf < M: the first M - S_suf rows see no suffix key at all, only the prefix."""
    q, k, v = _normal(2, 6, 8), _normal(2, 20, 8), _normal(2, 20, 8)
    ks, vs = _normal(2, 2, 8), _normal(2, 2, 8)
    got = attend(q, k, v, k_suf=ks, v_suf=vs)
    _check(got, reference(q, k, v, k_suf=ks, v_suf=vs))
    prefix_only = attend(q[:, :4], k, v)
    np.testing.assert_allclose(got.out[:, :4], prefix_only.out, atol=1e-6)


@pytest.mark.parametrize("score_bytes", [4, 256, 4096])
def test_online_softmax_blocks_equal_one_pass(score_bytes: int) -> None:
    """Bounding the score matrix (down to one key per block) changes nothing but the
    last ulps."""
    q, k, v = _normal(8, 3, 16), _normal(2, 300, 16), _normal(2, 300, 16)
    ks, vs = _normal(2, 5, 16), _normal(2, 5, 16)
    hm = np.arange(8) // 4
    whole = attend(q, k, v, head_map=hm, k_suf=ks, v_suf=vs)
    blocked = attend(q, k, v, head_map=hm, k_suf=ks, v_suf=vs, score_bytes=score_bytes)
    np.testing.assert_allclose(blocked.out, whole.out, atol=1e-6)
    np.testing.assert_allclose(blocked.lse, whole.lse, atol=1e-5)
    _check(blocked, reference(q, k, v, hm, k_suf=ks, v_suf=vs))


def test_stable_with_huge_scores() -> None:
    """Scores around 1e4 would overflow exp() in fp32 without the running max."""
    q, k, v = _normal(2, 2, 64, scale=30.0), _normal(2, 40, 64, scale=30.0), _normal(2, 40, 64)
    got = attend(q, k, v, score_bytes=64)
    assert np.isfinite(got.out).all() and np.isfinite(got.lse).all()
    want = reference(q, k, v)
    np.testing.assert_allclose(got.out, want[0], atol=1e-4)
    np.testing.assert_allclose(got.lse, want[1], rtol=1e-5)


@pytest.mark.parametrize("ratio", [1, 2, 4, 8])
@pytest.mark.parametrize("m_rows", [1, 4])
def test_matches_torch_sdpa(ratio: int, m_rows: int) -> None:
    """Against torch.nn.functional.scaled_dot_product_attention: the prefix plus a
    causal suffix is one attention with a boolean mask."""
    h_kv, n, s_suf, d = 2, 64, 6, 32
    h_q = h_kv * ratio
    q, k, v = _normal(h_q, m_rows, d), _normal(h_kv, n, d), _normal(h_kv, n, d)
    ks, vs = _normal(h_kv, s_suf, d), _normal(h_kv, s_suf, d)
    hm = np.arange(h_q) // ratio
    got = attend(q, k, v, head_map=hm, k_suf=ks, v_suf=vs)
    keys = torch.from_numpy(np.concatenate([k, ks], axis=1)[hm])
    values = torch.from_numpy(np.concatenate([v, vs], axis=1)[hm])
    mask = torch.ones(m_rows, n + s_suf, dtype=torch.bool)
    for m in range(m_rows):
        mask[m, n + max(0, s_suf - m_rows + m + 1) :] = False
    want = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), keys, values, attn_mask=mask
    )
    np.testing.assert_allclose(got.out, want.numpy(), atol=ATOL)


def test_lse_merge_identity() -> None:
    """Attention over prefix + suffix equals the LSE merge of QUERY on the prefix with
    local attention over the suffix (the reason QUERY sends the LSE trailer)."""
    q, k, v = _normal(4, 5, 16), _normal(4, 70, 16), _normal(4, 70, 16)
    ks, vs = _normal(4, 12, 16), _normal(4, 12, 16)
    prefix = attend(q, k, v)
    local = Attention(*(a.astype(np.float32) for a in reference(q, ks, vs)))
    merged = merge(prefix, local)
    # The suffix here is fully visible to every row: S_suf - M + m >= S_suf - 1 needs
    # M = 1 per row, so compare with a non-causal concatenation.
    whole = attend(q, np.concatenate([k, ks], axis=1), np.concatenate([v, vs], axis=1))
    np.testing.assert_allclose(merged.out, whole.out, atol=1e-5)
    np.testing.assert_allclose(merged.lse, whole.lse, atol=1e-5)


@pytest.mark.parametrize("selector", ["block_mean", "quest"])
@pytest.mark.parametrize("ratio", [1, 4])
@pytest.mark.parametrize(("block", "top"), [(16, 3), (10, 100), (7, 1), (500, 2)])
def test_sparse_selection_matches_reference(
    selector: str, ratio: int, block: int, top: int
) -> None:
    h_kv, n, d = 2, 203, 16
    q, k = _normal(h_kv * ratio, d), _normal(h_kv, n, d)
    hm = np.arange(h_kv * ratio) // ratio
    got = select_blocks(q, k, head_map=hm, block=block, top=top, selector=selector)
    np.testing.assert_array_equal(
        got, reference_blocks(q, k, hm, block=block, top=top, selector=selector)
    )
    assert (n - 1) in got  # the last block is always kept


@pytest.mark.parametrize("window", [0, 40])
@pytest.mark.parametrize("s_suf", [0, 4])
def test_sparse_attention_matches_reference(window: int, s_suf: int) -> None:
    h_kv, h_q, n, d = 2, 8, 150, 16
    q, k, v = _normal(h_q, d), _normal(h_kv, n, d), _normal(h_kv, n, d)
    ks, vs = _normal(h_kv, s_suf, d), _normal(h_kv, s_suf, d)
    hm = np.arange(h_q) // 4
    keys = select_blocks(q, k, head_map=hm, block=16, top=3)
    suffix = {"k_suf": ks, "v_suf": vs} if s_suf else {}
    got = attend(q[:, None], k, v, head_map=hm, window=window, keys=keys, **suffix)
    _check(got, reference(q[:, None], k, v, hm, window=window, keys=keys, **suffix))


def test_shape_errors_are_value_errors() -> None:
    q, k = _normal(3, 1, 8), _normal(2, 10, 8)
    with pytest.raises(ValueError, match="multiple"):
        attend(q, k, k)
    with pytest.raises(ValueError, match="head_map values"):
        attend(_normal(2, 1, 8), k, k, head_map=np.array([0, 2]))
    with pytest.raises(ValueError, match="do not agree"):
        attend(_normal(2, 1, 4), k, k)


@settings(max_examples=40, deadline=None)
@given(
    h_kv=st.integers(1, 3),
    ratio=st.sampled_from([1, 2, 4]),
    m_rows=st.integers(1, 4),
    n=st.integers(1, 40),
    s_suf=st.integers(0, 5),
    window=st.integers(0, 45),
    score_bytes=st.sampled_from([4, 100, 1 << 20]),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_shapes_match_reference(
    *,
    h_kv: int,
    ratio: int,
    m_rows: int,
    n: int,
    s_suf: int,
    window: int,
    score_bytes: int,
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    h_q, d = h_kv * ratio, 8

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    q, k, v, ks, vs = (
        rand(h_q, m_rows, d),
        rand(h_kv, n, d),
        rand(h_kv, n, d),
        rand(h_kv, s_suf, d),
        rand(h_kv, s_suf, d),
    )
    hm = np.arange(h_q) // ratio
    got = attend(q, k, v, head_map=hm, window=window, k_suf=ks, v_suf=vs, score_bytes=score_bytes)
    _check(got, reference(q, k, v, hm, window=window, k_suf=ks, v_suf=vs))


@pytest.mark.parametrize("selector", ["block_mean", "quest"])
def test_sparse_selection_in_bounded_runs_of_blocks(selector: str) -> None:
    """Tiny blocks over a long prefix: summaries come a few blocks at a time."""
    q, k = _normal(8, 16), _normal(2, 999, 16)
    hm = np.arange(8) // 4
    whole = select_blocks(q, k, head_map=hm, block=3, top=40, selector=selector)
    runs = select_blocks(q, k, head_map=hm, block=3, top=40, selector=selector, score_bytes=1)
    np.testing.assert_array_equal(whole, runs)
    np.testing.assert_array_equal(
        whole, reference_blocks(q, k, hm, block=3, top=40, selector=selector)
    )
