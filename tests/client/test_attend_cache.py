"""Our own PionPromptCache's Stage-2 methods end to end against our server:
``attend_store``, ``attend_query``/``attend_query_lse``, ``warm``, ``lookup(stage2=True)``
probing both tiers, and the COLDMISS -> WARM -> retry path (sync and asyncio)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from pion.client import AsyncPionPromptCache, PionColdMiss, PionPromptCache
from pion.server.run import ServerThread
from support.attend import reference

RNG = np.random.default_rng(13)
H, N, D = 4, 64, 16


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def layers(count: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return [rand(H, N, D) for _ in range(count)], [rand(H, N, D) for _ in range(count)]


def test_store_query_and_lse(server: ServerThread) -> None:
    with PionPromptCache(server.host, server.port) as pc:
        ns = pc.make_namespace("direct")
        (k,), (v,) = layers(1)
        pc.attend_store(ns, 0, k, v)
        q1 = rand(H, D)
        out = pc.attend_query(ns, 0, q1)
        assert out.shape == (H, D)
        np.testing.assert_allclose(out, reference(q1[:, None], k, v)[0][:, 0], atol=2e-5)
        q = rand(H, 3, D)
        out, lse = pc.attend_query_lse(ns, 0, q, fa_window=9)
        want_out, want_lse = reference(q, k, v, window=9)
        np.testing.assert_allclose(out, want_out, atol=2e-5)
        assert lse is not None
        np.testing.assert_allclose(lse, want_lse, atol=2e-5)
        assert pc.attend_query_lse(ns, 0, q1)[1] is None


def test_warm_and_two_tier_lookup(server: ServerThread) -> None:
    with PionPromptCache(server.host, server.port) as pc:
        ns = pc.make_namespace("two-tier")
        keys, values = layers(3)
        pc.register(ns, H * D, "fp16")
        pc.store(ns, keys, values)
        assert pc.lookup(ns) is True
        assert pc.lookup(ns, stage2=True) is False  # nothing in the attention tier yet
        warmed = pc.warm(ns, H, D)
        assert (warmed.layers, warmed.skipped_dim) == (3, 0)
        assert pc.lookup(ns, stage2=True) is True
        assert pc.warm(ns, 2 * H, D).skipped_dim == 3  # [N, H*D] does not split that way
        q = rand(H, 2, D)
        for layer in range(3):
            k16 = keys[layer].astype(np.float16).astype(np.float32)
            v16 = values[layer].astype(np.float16).astype(np.float32)
            out = pc.attend_query(ns, layer, q)
            np.testing.assert_allclose(out, reference(q, k16, v16)[0], atol=2e-5)


def test_coldmiss_warm_retry(server_factory: Callable[..., ServerThread]) -> None:
    server = server_factory(attend_warm_slots=2)
    with PionPromptCache(server.host, server.port) as pc:
        ns = pc.make_namespace("cold")
        keys, values = layers(2)
        pc.register(ns, H * D, "fp16")
        pc.store(ns, keys, values)
        for layer in range(2):
            pc.attend_store(ns, layer, keys[layer], values[layer])
        other = pc.make_namespace("other")
        for layer in range(2):
            pc.attend_store(other, layer, rand(H, N, D), rand(H, N, D))
        assert pc.lookup(ns, stage2=True) is False  # V-store HIT, attention tier COLD
        q = rand(H, 2, D)
        out = pc.attend_query(ns, 1, q)
        k16 = keys[1].astype(np.float16).astype(np.float32)
        v16 = values[1].astype(np.float16).astype(np.float32)
        np.testing.assert_allclose(out, reference(q, k16, v16)[0], atol=2e-5)
        assert pc.cold_rehydrates_observed == 1
        # Without the V-store rows WARM brings back nothing: the miss reaches the caller.
        assert pc.drop(ns) == 1
        for layer in range(2):
            pc.attend_store(other, layer, rand(H, N, D), rand(H, N, D))
        with pytest.raises(PionColdMiss):
            pc.attend_query(ns, 1, q)
        assert pc.cold_rehydrates_observed == 2


def test_async_attend(server_factory: Callable[..., ServerThread]) -> None:
    server = server_factory(attend_warm_slots=1)

    async def scenario() -> None:
        async with AsyncPionPromptCache(server.host, server.port) as apc:
            ns = apc.make_namespace("async-attn")
            keys, values = layers(1)
            await apc.register(ns, H * D, "fp16")
            await apc.store(ns, keys, values)
            await apc.attend_store(ns, 0, keys[0], values[0])
            await apc.attend_store(apc.make_namespace("x"), 0, keys[0], values[0])
            q = rand(H, D)
            out = await apc.attend_query(ns, 0, q)  # COLD -> WARM -> retry
            k16 = keys[0].astype(np.float16).astype(np.float32)
            v16 = values[0].astype(np.float16).astype(np.float32)
            np.testing.assert_allclose(out, reference(q[:, None], k16, v16)[0][:, 0], atol=2e-5)
            assert apc.cold_rehydrates_observed == 1
            assert (await apc.warm(ns, H, D)).layers == 1

    asyncio.run(scenario())
