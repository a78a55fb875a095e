"""Pion's own Python client (``pion-vllm-mlx``, numpy only, ``model=None``) against our
attention tier, unmodified: ``attend_store_layer``, ``attend_query`` with and without
the LSE, ``attend_query_fused`` over the binary lane and over RESP
(``PION_PROMPT_CACHE_NO_BINARY=1``), the sparse variants, ``_warm_namespace``, the
COLDMISS -> WARM -> retry path on both lanes, and the two-tier ``lookup``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis
from pion_vllm_mlx.prompt_cache import PionPromptCache as PionsClient

from pion.server.run import ServerThread
from support.attend import reference, reference_blocks

RNG = np.random.default_rng(21)
H_KV, H_Q, N, D = 2, 8, 96, 32
ATOL = 2e-5


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def clients(
    server_factory: Callable[..., ServerThread], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., PionsClient]]:
    made: list[PionsClient] = []

    def make(server: ServerThread, *, binary: bool = True, **kw: Any) -> PionsClient:
        # Read by the client's constructor.
        monkeypatch.setenv("PION_PROMPT_CACHE_NO_BINARY", "0" if binary else "1")
        pc = PionsClient(model=None, host=server.host, port=server.port, **kw)
        made.append(pc)
        return pc

    yield make
    for pc in made:
        pc.resp.sock.close()
        if pc._binary is not None:
            pc._binary.close()


def test_store_and_query_with_and_without_lse(
    server: ServerThread, clients: Callable[..., PionsClient]
) -> None:
    pc = clients(server)
    k, v = rand(H_KV, N, D), rand(H_KV, N, D)
    pc.attend_store_layer("ns", 2, k, v)
    q1 = rand(H_KV, D)
    out = pc.attend_query("ns", 2, q1)  # M = 1, top_k defaulted by the client
    np.testing.assert_allclose(out, reference(q1[:, None], k, v)[0][:, 0], atol=ATOL)
    q = rand(H_KV, 5, D)
    out = pc.attend_query("ns", 2, q, top_k=7)
    np.testing.assert_allclose(out, reference(q, k, v)[0], atol=ATOL)
    out, lse = pc.attend_query("ns", 2, q, with_lse=True, fa_window=11)
    want_out, want_lse = reference(q, k, v, window=11)
    np.testing.assert_allclose(out, want_out, atol=ATOL)
    np.testing.assert_allclose(lse, want_lse, atol=ATOL)
    assert pc.attend_query_calls == 3


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("ratio", [1, 4])
def test_query_fused_on_both_lanes(
    server: ServerThread, clients: Callable[..., PionsClient], binary: bool, ratio: int
) -> None:
    pc = clients(server, binary=binary)
    h_q = H_KV * ratio
    k, v = rand(H_KV, N, D), rand(H_KV, N, D)
    pc.attend_store_layer("ns", 0, k, v)
    hm = (np.arange(h_q) // ratio).astype(np.uint8)
    for m_rows, s_suf, window in [(1, 0, None), (4, 6, None), (3, 3, 20), (1, 9, 0)]:
        q, ks, vs = rand(h_q, m_rows, D), rand(H_KV, s_suf, D), rand(H_KV, s_suf, D)
        out = pc.attend_query_fused("ns", 0, q, ks, vs, hm, fa_window=window)
        want = reference(q, k, v, hm, window=window or 0, k_suf=ks, v_suf=vs)[0]
        np.testing.assert_allclose(out, want, atol=ATOL)
    # The lane the answers came over: port+1 unless the environment said RESP.
    assert (pc._binary is not None) is binary and pc._binary_disabled is not binary


@pytest.mark.parametrize("selector", ["block_mean", "quest"])
def test_sparse_variants(
    server: ServerThread, clients: Callable[..., PionsClient], selector: str
) -> None:
    pc = clients(server)
    n = 500
    k, v = rand(H_KV, n, D), rand(H_KV, n, D)
    pc.attend_store_layer("sp", 1, k, v)
    q, ks, vs = rand(H_Q, D), rand(H_KV, 4, D), rand(H_KV, 4, D)
    hm = np.arange(H_Q) // 4
    keys = reference_blocks(q, k, hm, block=64, top=2, selector=selector)
    out = pc.attend_query_sparse_auto("sp", 1, q, 64, 2, H_kv=H_KV, selector=selector)
    np.testing.assert_allclose(out, reference(q[:, None], k, v, hm, keys=keys)[0][:, 0], atol=ATOL)
    out = pc.attend_query_sparse_auto_fused(
        "sp",
        1,
        q,
        64,
        2,
        ks,
        vs,
        H_kv=H_KV,
        head_map=hm.astype(np.uint8),
        fa_window=300,
        selector=selector,
    )
    want = reference(q[:, None], k, v, hm, window=300, keys=keys, k_suf=ks, v_suf=vs)[0]
    np.testing.assert_allclose(out, want[:, 0], atol=ATOL)


def _register(server: ServerThread, ns: str, layers: int) -> list[np.ndarray]:
    """Prefix rows in the V-store (fp32 layers, so they come back exactly), as the
    client's Stage-1 path would have stored them; returns [K0, V0, K1, V1, ...]."""
    c = redis.Redis(port=server.port)
    c.execute_command("KV.PREFIX.REGISTER", ns, H_KV * D, "fp16")
    out = []
    for layer in range(layers):
        for half in ("_pk", "_pv"):
            rows = rand(N, H_KV * D).astype(np.float16).astype(np.float32)
            c.execute_command("V.STOREBATCH", ns + half, layer, 0, N, rows.tobytes())
            out.append(rows.reshape(N, H_KV, D).transpose(1, 0, 2))
    c.close()
    return out


def test_warm_namespace_and_two_tier_lookup(
    server: ServerThread, clients: Callable[..., PionsClient]
) -> None:
    pc = clients(server, stage2=True)
    ns = pc.make_namespace("model", "prompt")
    kv = _register(server, ns, 3)
    assert pc.lookup(ns) is False  # the V-store has it, the attention tier does not
    assert pc._warm_namespace(ns, H_KV, D) == 3
    assert pc.lookup(ns) is True
    q = rand(H_KV, 2, D)
    for layer in range(3):
        out = pc.attend_query(ns, layer, q)
        np.testing.assert_allclose(
            out, reference(q, kv[2 * layer], kv[2 * layer + 1])[0], atol=ATOL
        )
    assert pc._warm_namespace(pc.make_namespace("never"), H_KV, D) == 0  # -ERR -> 0


@pytest.mark.parametrize("binary", [True, False])
def test_coldmiss_warm_retry(
    server_factory: Callable[..., ServerThread], clients: Callable[..., PionsClient], binary: bool
) -> None:
    """Demoted slots come back through the client's own retry: -COLDMISS (RESP) or
    status 3 (binary lane), then KV.PREFIX.WARM <ns> H D <ns>_attn, then the query.
    The client warms with H = H_q, so this is the non-GQA case (H_q = H_kv)."""
    server = server_factory(attend_warm_slots=2)
    pc = clients(server, binary=binary)
    ns = pc.make_namespace("cold")
    kv = _register(server, ns, 2)
    for layer in range(2):
        pc.attend_store_layer(ns, layer, kv[2 * layer], kv[2 * layer + 1])
    for layer in range(2):  # push both out of the two WARM slots
        pc.attend_store_layer("other", layer, rand(H_KV, N, D), rand(H_KV, N, D))
    c = redis.Redis(port=server.port)
    assert c.execute_command("ATTEND.PREFIX.LOOKUP", ns + "_attn", 0) == b"COLD"
    q, e = rand(H_KV, 3, D), np.zeros((H_KV, 0, D), np.float32)
    hm = np.arange(H_KV, dtype=np.uint8)
    out = pc.attend_query_fused(ns, 0, q, e, e, hm)
    np.testing.assert_allclose(out, reference(q, kv[0], kv[1])[0], atol=ATOL)
    assert pc.cold_rehydrates_observed == 1
    assert (pc._binary is not None) is binary  # the binary lane survived its COLDMISS
    info = dict(
        line.split(":")
        for line in c.execute_command("KV.PREFIX.INFO").decode().split("\r\n")
        if line
    )
    assert int(info["sdpa_rehydrates"]) == 2 and int(info["sdpa_demotions"]) >= 2
    # And through attend_query (RESP only): demote again, query layer 1.
    for layer in range(2):
        pc.attend_store_layer("other", layer, rand(H_KV, N, D), rand(H_KV, N, D))
    out = pc.attend_query(ns, 1, q)
    np.testing.assert_allclose(out, reference(q, kv[2], kv[3])[0], atol=ATOL)
    assert pc.cold_rehydrates_observed == 2
    c.close()


def test_binary_failure_falls_back_to_resp_and_raises(
    server: ServerThread, clients: Callable[..., PionsClient]
) -> None:
    pc = clients(server)
    q, e = rand(H_KV, 1, D), np.zeros((H_KV, 0, D), np.float32)
    with pytest.raises(RuntimeError, match="session not found"):
        pc.attend_query_fused("missing", 0, q, e, e, np.arange(H_KV, dtype=np.uint8))
    assert pc._binary is None and pc._binary_disabled  # its rule: disable on any error
