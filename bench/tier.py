"""The cluster tier (issue 17): fetching a prefix on node B that only the tier holds.

Setup: a 3-node Redis Cluster on loopback (Debian redis-server, no persistence), two
pion-servers A and B on it (``--tier``, default sync writes, default WAL). A stores two
prefixes, each 16 layers x 2048 tokens x 1024 values fp16 on both halves (K and V:
2 x 64 MiB). B runs with ``--vstore-max-sessions 2`` (one namespace), so fetching the
two prefixes in turn makes every fetch a read-through fill from the tier.

Measured, as the median of ``--repeat`` runs:

1. tier fill on B: ``V.FETCH <ns>_pk BATCH 0 2048 16 FMT NATIVE`` and the same for
   ``_pv``, pipelined through redis-py, on a prefix B does not hold (the fill reads the
   tier while the reply streams, layer by layer as each lands, then stores the rows in
   B's V-store);
2. baseline: redis-py ``GET`` of the same bytes from the same cluster, one key per layer
   per half (32 x 4 MiB) in one cluster pipeline: what a client would do with the
   cluster alone. Also the same bytes in the tier's own key layout (256 x 512 KiB);
3. local hit on B: the same two fetches of the prefix B now holds.

Ratios: (1) throughput / (2) throughput, and (1) time / (3) time. Also: the cost of a
sync write-through (A storing one prefix) against a pion-server without a tier.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis

from _common import print_table, start_pion, write_results

LAYERS, TOKENS, DIM = 16, 2048, 1024


def _store(r: redis.Redis, ns: str, seed: int, tokens: int) -> None:
    rng = np.random.default_rng(seed)
    assert r.execute_command("KV.PREFIX.REGISTER", ns, DIM, "fp16") == b"OK"
    for sid in (f"{ns}_pk", f"{ns}_pv"):
        for layer in range(LAYERS):
            blob = rng.standard_normal((tokens, DIM)).astype("<f2").tobytes()
            r.execute_command("V.STOREBATCH", sid, layer, 0, tokens, blob, "FMT", "F16")


def _fetch(r: redis.Redis, ns: str, tokens: int) -> int:
    pipe = r.pipeline(transaction=False)
    for sid in (f"{ns}_pk", f"{ns}_pv"):
        pipe.execute_command("V.FETCH", sid, "BATCH", 0, tokens, LAYERS, "FMT", "NATIVE")
    return sum(len(b) for reply in pipe.execute() for b in reply)


def _median(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(tokens: int, repeat: int) -> dict[str, Any]:
    # Importable once _common has put scripts/ on sys.path.
    from pion_testing.redis_nodes import RedisCluster3

    cluster = RedisCluster3(durable=False)
    flags = ["--tier", cluster.url, "--tier-prefix", "bench", "--log-level", "warning"]
    a = start_pion(*flags)
    b = start_pion(*flags, "--vstore-max-sessions", "2")
    plain = start_pion("--log-level", "warning")
    try:
        ra, rb, rp = (redis.Redis(port=p.port) for p in (a, b, plain))
        prefix_bytes = 2 * LAYERS * tokens * DIM * 2
        # Write-through cost: the same store on A (sync tier) and on a node without one.
        t0 = time.perf_counter()
        _store(ra, "p0", 0, tokens)
        store_tier = time.perf_counter() - t0
        t0 = time.perf_counter()
        _store(rp, "p0", 0, tokens)
        store_plain = time.perf_counter() - t0
        _store(ra, "p1", 1, tokens)

        names = iter(["p0", "p1"] * repeat)

        def fill() -> None:
            assert _fetch(rb, next(names), tokens) == prefix_bytes

        _fetch(rb, "p1", tokens)  # warm the connections; B now holds p1
        fill_s = _median(fill, repeat)  # p0, p1, p0 ...: each one a fill
        fills = int(rb.info("tier")["tier_hits"])
        streamed = int(rb.info("tier")["tier_streamed_fills"])
        last = "p1" if repeat % 2 == 0 else "p0"
        local_s = _median(lambda: _fetch(rb, last, tokens), repeat)

        # Baselines: the same bytes as plain keys in the same cluster.
        rc = cluster.client()
        rng = np.random.default_rng(9)
        layer_keys = [f"base:{half}:{i}" for half in "kv" for i in range(2 * LAYERS // 2)]
        for key in layer_keys:
            rc.set(key, rng.standard_normal((tokens, DIM)).astype("<f2").tobytes())
        chunk_keys = [f"base:chunk:{i}" for i in range(len(layer_keys) * tokens // 256)]
        for key in chunk_keys:
            rc.set(key, rng.standard_normal((256, DIM)).astype("<f2").tobytes())

        def get_all(keys: list[str]) -> int:
            pipe = rc.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            return sum(len(v) for v in pipe.execute())

        assert get_all(layer_keys) == prefix_bytes == get_all(chunk_keys)
        get_s = _median(lambda: get_all(layer_keys), repeat)
        get_chunks_s = _median(lambda: get_all(chunk_keys), repeat)
        rc.close()
    finally:
        for proc in (a, b, plain):
            proc.stop()
        cluster.stop()
    mib = prefix_bytes / 2**20
    return {
        "prefix": {"layers": LAYERS, "tokens": tokens, "dim": DIM, "format": "fp16"},
        "prefix_bytes": prefix_bytes,
        "repeat": repeat,
        "fills_counted_by_b": fills,
        "fills_streamed_by_b": streamed,
        "tier_fill_s": fill_s,
        "tier_fill_mib_s": mib / fill_s,
        "redis_get_s": get_s,
        "redis_get_mib_s": mib / get_s,
        "redis_get_tier_layout_s": get_chunks_s,
        "redis_get_tier_layout_mib_s": mib / get_chunks_s,
        "local_hit_s": local_s,
        "local_hit_mib_s": mib / local_s,
        "ratio_fill_vs_get_throughput": get_s / fill_s,
        "ratio_fill_vs_get_tier_layout_throughput": get_chunks_s / fill_s,
        "ratio_fill_vs_local_hit_time": fill_s / local_s,
        "store_with_sync_tier_s": store_tier,
        "store_without_tier_s": store_plain,
        "ratio_store_sync_tier_vs_none_time": store_tier / store_plain,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="256 tokens, 3 runs (smoke run)")
    args = ap.parse_args()
    tokens, repeat = (256, 3) if args.quick else (TOKENS, args.repeat)
    out = run(tokens, repeat)
    print_table(
        ["measure", "seconds", "MiB/s", "ratio"],
        [
            ["tier fill on B (V.FETCH BATCH x2)", out["tier_fill_s"], out["tier_fill_mib_s"], ""],
            [
                "redis-py GET, 32 x layer keys",
                out["redis_get_s"],
                out["redis_get_mib_s"],
                f"fill/GET throughput {out['ratio_fill_vs_get_throughput']:.2f}",
            ],
            [
                "redis-py GET, tier layout keys",
                out["redis_get_tier_layout_s"],
                out["redis_get_tier_layout_mib_s"],
                f"{out['ratio_fill_vs_get_tier_layout_throughput']:.2f}",
            ],
            [
                "local hit on B",
                out["local_hit_s"],
                out["local_hit_mib_s"],
                f"fill/local time {out['ratio_fill_vs_local_hit_time']:.2f}",
            ],
            [
                "store on A, sync tier / no tier",
                out["store_with_sync_tier_s"],
                "",
                f"{out['ratio_store_sync_tier_vs_none_time']:.2f}",
            ],
        ],
    )
    path = write_results("tier", out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
