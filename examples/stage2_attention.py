"""Stage 2 worked through: the server attends over a cached prefix; the client sends only
queries (and its own suffix K/V), never the prefix's K/V.

Start a server, then run this (numpy and Pion's client only)::

    pion-server --port 1974 &
    python examples/stage2_attention.py --port 1974

What it does, with a random "model" of 2 layers, 8 kv-heads x 64 dims and 32 query
heads (grouped-query attention):

1. Stage 1: the prefix's K/V rows go into the V-store (``register`` + ``store``): this
   is what survives restarts.
2. ``warm`` rehydrates the attention tier from those rows (``KV.PREFIX.WARM``): one
   WARM slot per layer, K/V ``[H, N, D]``.
3. Decoding a suffix token: ``attend_query_lse`` attends over the prefix on the server
   and returns the output with the log-sum-exp, which merges exactly with attention
   the client computes over its own suffix tokens. Pion's client does the same in one
   call over the binary lane (``attend_query_fused``).
4. The cold tier: when the WARM table evicts a slot, a query answers ``-COLDMISS`` and
   the client WARMs and retries by itself.

Every result is checked against plain numpy attention over prefix + suffix.
"""

from __future__ import annotations

import argparse

import numpy as np
import redis
from pion_vllm_mlx.prompt_cache import PionPromptCache as PionsClient

from pion.client import PionPromptCache

LAYERS, H_KV, H_Q, D, PREFIX, SUFFIX = 2, 8, 32, 64, 512, 5


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Plain softmax attention of q [H, M, D] over k/v [H, N, D] (no mask)."""
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def main(host: str = "127.0.0.1", port: int = 1974) -> None:
    rng = np.random.default_rng(0)
    keys = [rng.standard_normal((H_KV, PREFIX, D)).astype(np.float32) for _ in range(LAYERS)]
    values = [rng.standard_normal((H_KV, PREFIX, D)).astype(np.float32) for _ in range(LAYERS)]
    group = np.arange(H_Q) // (H_Q // H_KV)  # query head h reads kv-head group[h]

    with PionPromptCache(host, port) as pc:
        ns = pc.make_namespace("example-model", "system-prompt-v1")
        # 1. Stage 1: the durable copy of the prefix (fp16 rows [N, H*D] per layer).
        pc.register(ns, H_KV * D, "fp16")
        pc.store(ns, keys, values)
        # What the server holds is fp16: compare against that from here on.
        keys = [k.astype(np.float16).astype(np.float32) for k in keys]
        values = [v.astype(np.float16).astype(np.float32) for v in values]

        # 2. Rehydrate the attention tier: slots <ns>_attn / layer.
        warmed = pc.warm(ns, H_KV, D)
        print(f"WARM: {warmed.layers} layers ({warmed.skipped_dim} skipped)")
        assert pc.lookup(ns, stage2=True)  # both tiers hit

        # 3. One decode step of layer 1: the new token's query, and the suffix K/V the
        # client holds for the tokens after the prefix (here the query's own token too).
        q = rng.standard_normal((H_Q, 1, D)).astype(np.float32)
        k_suf = rng.standard_normal((H_KV, SUFFIX, D)).astype(np.float32)
        v_suf = rng.standard_normal((H_KV, SUFFIX, D)).astype(np.float32)
        want = attention(
            q,
            np.concatenate([keys[1], k_suf], axis=1)[group],
            np.concatenate([values[1], v_suf], axis=1)[group],
        )

        # a) Prefix attention on the server (QUERY takes H = the slot's heads, so
        #    each kv-head's query group goes as M rows), merged locally by LSE.
        grouped = q.reshape(H_KV, H_Q // H_KV, D)
        prefix_out, prefix_lse = pc.attend_query_lse(ns, 1, grouped)
        assert prefix_lse is not None
        s = grouped @ k_suf.transpose(0, 2, 1) / np.sqrt(D)
        suffix_lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
        suffix_out = attention(grouped, k_suf, v_suf)
        total = np.logaddexp(prefix_lse, suffix_lse)
        merged = (
            prefix_out * np.exp(prefix_lse - total)[..., None]
            + suffix_out * np.exp(suffix_lse - total)[..., None]
        ).reshape(H_Q, 1, D)
        print("QUERY + LSE merge, max error:", float(np.abs(merged - want).max()))
        assert np.allclose(merged, want, atol=1e-4)

    # b) The same step in one call: QUERY_FUSED over the binary lane (port + 1), with
    #    Pion's own client.
    pion = PionsClient(model=None, host=host, port=port)
    fused = pion.attend_query_fused(ns, 1, q, k_suf, v_suf, group.astype(np.uint8))
    print("QUERY_FUSED (binary lane), max error:", float(np.abs(fused - want).max()))
    assert np.allclose(fused, want, atol=1e-4) and pion._binary is not None

    # 4. The cold tier. Fill the WARM table with other slots: the least recently used
    #    slots (ours) are demoted to COLD, their K/V released. The next query answers
    #    -COLDMISS; the client sends KV.PREFIX.WARM and retries, by itself.
    r = redis.Redis(host=host, port=port)
    slots = int(r.info("memory")["attend_slots"])
    tiny = np.zeros((1, 1, 1), np.float32).tobytes()
    for i in range(slots):
        r.execute_command("ATTEND.PREFIX.STORE", "filler", i, 1, 1, 1, tiny, tiny)
    print("layer 0 is now", r.execute_command("ATTEND.PREFIX.LOOKUP", ns + "_attn", 0).decode())
    with PionPromptCache(host, port) as pc:
        out = pc.attend_query(ns, 1, grouped)  # -COLDMISS, WARM, retry
        assert np.allclose(out, prefix_out, atol=1e-5)
        print("cold rehydrates the client observed:", pc.cold_rehydrates_observed)
    info = r.execute_command("KV.PREFIX.INFO").decode()
    print(" ".join(line for line in info.split() if line.startswith("sdpa_")))
    r.execute_command("ATTEND.PREFIX.DROP", "filler")
    r.close()
    pion.resp.sock.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1974)
    args = ap.parse_args()
    main(args.host, args.port)
