"""Our client's fused and sparse attention queries (``attend_query_fused``,
``attend_query_sparse_auto``, ``attend_query_sparse_auto_fused``, sync and asyncio)
against the server: the float64 reference, the bytes Pion's own client gets for the
same call (same positional arguments), the COLDMISS -> WARM -> retry path, and shapes
refused before anything is sent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from pion_vllm_mlx.prompt_cache import PionPromptCache as PionsClient

from pion.client import AsyncPionPromptCache, PionColdMiss, PionPromptCache
from pion.server.run import ServerThread
from support.attend import reference, reference_blocks

RNG = np.random.default_rng(25)
H_KV, H_Q, N, D = 2, 8, 200, 16
ATOL = 2e-5


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def pions(server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> Iterator[PionsClient]:
    monkeypatch.setenv("PION_PROMPT_CACHE_NO_BINARY", "1")  # RESP, as ours
    pc = PionsClient(model=None, host=server.host, port=server.port)
    yield pc
    pc.resp.sock.close()


def test_fused_matches_the_reference_and_pions_client(
    server: ServerThread, pions: PionsClient
) -> None:
    k, v = rand(H_KV, N, D), rand(H_KV, N, D)
    with PionPromptCache(server.host, server.port) as pc:
        pc.attend_store("f", 0, k, v)
        for m_rows, s_suf, window in [(1, 0, None), (4, 6, None), (3, 3, 20)]:
            q, ks, vs = rand(H_Q, m_rows, D), rand(H_KV, s_suf, D), rand(H_KV, s_suf, D)
            hm = RNG.permutation(np.arange(H_Q) // 4).astype(np.uint8)
            ours = pc.attend_query_fused("f", 0, q, ks, vs, hm, window)
            want = reference(q, k, v, hm, window=window or 0, k_suf=ks, v_suf=vs)[0]
            assert ours.shape == q.shape and ours.dtype == np.float32
            np.testing.assert_allclose(ours, want, atol=ATOL)
            theirs = pions.attend_query_fused("f", 0, q, ks, vs, hm, window)
            np.testing.assert_array_equal(ours, theirs)
        # head_map defaults to the standard GQA map h // (H_q // H_kv).
        q, ks, vs = rand(H_Q, 2, D), rand(H_KV, 2, D), rand(H_KV, 2, D)
        hm = (np.arange(H_Q) // 4).astype(np.uint8)
        np.testing.assert_array_equal(
            pc.attend_query_fused("f", 0, q, ks, vs), pc.attend_query_fused("f", 0, q, ks, vs, hm)
        )


@pytest.mark.parametrize("selector", ["block_mean", "quest"])
def test_sparse_matches_the_reference_and_pions_client(
    server: ServerThread, pions: PionsClient, selector: str
) -> None:
    k, v = rand(H_KV, N, D), rand(H_KV, N, D)
    q, ks, vs = rand(H_Q, D), rand(H_KV, 5, D), rand(H_KV, 5, D)
    hm = (np.arange(H_Q) // 4).astype(np.uint8)
    keys = reference_blocks(q, k, hm, block=32, top=2, selector=selector)
    with PionPromptCache(server.host, server.port) as pc:
        pc.attend_store("s", 3, k, v)
        ours = pc.attend_query_sparse_auto("s", 3, q, 32, 2, H_KV, None, None, selector)
        assert ours.shape == (H_Q, D)
        want = reference(q[:, None], k, v, hm, keys=keys)[0][:, 0]
        np.testing.assert_allclose(ours, want, atol=ATOL)
        theirs = pions.attend_query_sparse_auto("s", 3, q, 32, 2, H_KV, None, None, selector)
        np.testing.assert_array_equal(ours, theirs)

        ours = pc.attend_query_sparse_auto_fused("s", 3, q, 32, 2, ks, vs, H_KV, hm, 150, selector)
        want = reference(q[:, None], k, v, hm, window=150, keys=keys, k_suf=ks, v_suf=vs)[0]
        np.testing.assert_allclose(ours, want[:, 0], atol=ATOL)
        theirs = pions.attend_query_sparse_auto_fused(
            "s", 3, q, 32, 2, ks, vs, H_KV, hm, 150, selector
        )
        np.testing.assert_array_equal(ours, theirs)
        # Non-GQA: H_kv defaults to H_q (to the suffix's heads for the fused form).
        k8, v8 = rand(H_Q, N, D), rand(H_Q, N, D)
        pc.attend_store("s8", 0, k8, v8)
        keys8 = reference_blocks(q, k8, None, block=50, top=1, selector=selector)
        got = pc.attend_query_sparse_auto("s8", 0, q, 50, 1, selector=selector)
        want = reference(q[:, None], k8, v8, keys=keys8)[0][:, 0]
        np.testing.assert_allclose(got, want, atol=ATOL)


def test_bad_shapes_are_refused_before_sending(server: ServerThread) -> None:
    with PionPromptCache(server.host, server.port) as pc:
        pc.attend_store("b", 0, rand(H_KV, N, D), rand(H_KV, N, D))
        q, ks = rand(H_Q, 1, D), rand(H_KV, 2, D)
        with pytest.raises(ValueError, match="differ"):
            pc.attend_query_fused("b", 0, q, ks, rand(H_KV, 3, D))
        with pytest.raises(ValueError, match="multiple of H_kv"):
            pc.attend_query_fused("b", 0, rand(6, 1, D), rand(4, 2, D), rand(4, 2, D))
        with pytest.raises(ValueError, match="head_map values"):
            pc.attend_query_fused("b", 0, q, ks, ks, np.full(H_Q, 2))
        with pytest.raises(ValueError, match="unknown selector"):
            pc.attend_query_sparse_auto("b", 0, q[:, 0], 8, 1, H_KV, selector="lsh")
        with pytest.raises(ValueError, match="expected 2 dimensions"):
            pc.attend_query_sparse_auto("b", 0, q, 8, 1, H_KV)
        # Nothing reached the server's attention tier: the slot still answers.
        assert pc.attend_query_fused("b", 0, q, ks, ks).shape == q.shape


def test_coldmiss_warm_retry_sync_and_async(
    server_factory: Callable[..., ServerThread],
) -> None:
    server = server_factory(attend_warm_slots=1)
    keys, values = rand(N, H_KV * D), rand(N, H_KV * D)
    k16 = keys.astype(np.float16).astype(np.float32).reshape(N, H_KV, D).transpose(1, 0, 2)
    v16 = values.astype(np.float16).astype(np.float32).reshape(N, H_KV, D).transpose(1, 0, 2)
    q, ks, vs = rand(H_Q, 2, D), rand(H_KV, 3, D), rand(H_KV, 3, D)
    hm = np.arange(H_Q) // 4
    with PionPromptCache(server.host, server.port) as pc:
        pc.register("c", H_KV * D, "fp16")
        pc.store("c", [keys], [values])
        pc.attend_store("c", 0, k16, v16)
        pc.attend_store("other", 0, rand(H_KV, N, D), rand(H_KV, N, D))  # "c" goes COLD
        out = pc.attend_query_fused("c", 0, q, ks, vs)
        np.testing.assert_allclose(
            out, reference(q, k16, v16, hm, k_suf=ks, v_suf=vs)[0], atol=ATOL
        )
        assert pc.cold_rehydrates_observed == 1

    async def scenario() -> None:
        async with AsyncPionPromptCache(server.host, server.port) as apc:
            await apc.attend_store("other", 0, rand(H_KV, N, D), rand(H_KV, N, D))
            q1 = q[:, 0]
            keys_sel = reference_blocks(q1, k16, hm, block=40, top=2)
            got = await apc.attend_query_sparse_auto("c", 0, q1, 40, 2, H_KV)  # COLD
            want = reference(q1[:, None], k16, v16, hm, keys=keys_sel)[0][:, 0]
            np.testing.assert_allclose(got, want, atol=ATOL)
            got = await apc.attend_query_sparse_auto_fused("c", 0, q1, 40, 2, ks, vs)
            want = reference(q1[:, None], k16, v16, hm, keys=keys_sel, k_suf=ks, v_suf=vs)[0]
            np.testing.assert_allclose(got, want[:, 0], atol=ATOL)
            fused = await apc.attend_query_fused("c", 0, q, ks, vs, hm, 0)
            np.testing.assert_allclose(fused, out, atol=1e-6)
            assert apc.cold_rehydrates_observed == 1
            await apc.drop("c")
            await apc.attend_store("other", 0, rand(H_KV, N, D), rand(H_KV, N, D))
            await apc.attend_store("x", 0, rand(H_KV, N, D), rand(H_KV, N, D))
            with pytest.raises(PionColdMiss):  # nothing in the V-store to WARM from
                await apc.attend_query_fused("c", 0, q, ks, vs)

    asyncio.run(scenario())
