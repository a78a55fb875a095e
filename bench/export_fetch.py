"""Same-machine fetch: ``PionPromptCache.fetch`` through ``V.EXPORT`` against the same
fetch over TCP, in the same run, from the same ``pion-server`` process.

A prefix of L layers x T tokens x kv_dim (fp16, as the client stores by default) is
stored once. Then, each a median over --repeat calls from a fresh client object:

- ``tcp``: ``fetch(ns, T)`` with the export lane off (V.INFO + V.FETCH BATCH FMT
  NATIVE, fp16 on the wire, converted to fp32 by the client);
- ``export (reused)``: ``fetch(ns, T)`` with the lane on, the file already written
  (V.INFO, V.EXPORT answered with the existing file, the file mapped and converted);
- ``export (first)``: the same after a one-row write made the file stale, so the
  server writes it again within the call (the cost a prefix's first hit pays).

Both lanes return fp32 ``[T, kv_dim]`` per layer and the run checks they are equal.
Pion's own figures for the export lane (mlx client, 2,049 tokens): 37 ms against 67 ms
over TCP (1.8x). Issue 13's target: ``export (reused)`` at least 1.5x faster than
``tcp`` at 2,048 tokens x 16 layers x kv_dim 1024.

With ``--pion-client`` it also times Pion's own client (``pion-vllm-mlx``): its
``_export`` plus ``mx.load`` of every tensor against its two ``V.FETCH BATCH`` calls
(needs ``mlx``, which the dev requirements install on CPU).

    python bench/export_fetch.py            # 16 x 2048 x 1024
    python bench/export_fetch.py --quick    # CI-sized
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, start_pion, timed, write_results
from pion.client import PionPromptCache


def _store(port: int, ns: str, layers: int, tokens: int, kv_dim: int) -> list[np.ndarray]:
    rng = np.random.default_rng(13)
    keys = [rng.standard_normal((tokens, kv_dim), dtype=np.float32) for _ in range(layers)]
    with PionPromptCache(port=port, export=False) as pc:
        pc.register(ns, kv_dim, "fp16")
        pc.store(ns, keys, [k * 0.5 for k in keys])
    return keys


def _ours(port: int, ns: str, tokens: int, repeat: int) -> dict[str, float]:
    tcp = PionPromptCache(port=port, export=False)
    lane = PionPromptCache(port=port, export=True)
    try:
        want_k, want_v = tcp.fetch(ns, tokens)
        got_k, got_v = lane.fetch(ns, tokens)  # writes the file
        if lane.export_lane.used != 1:
            raise RuntimeError(f"the export lane was not used: {lane.export_lane}")
        for a, b in zip([*want_k, *want_v], [*got_k, *got_v], strict=True):
            if not np.array_equal(a, b):
                raise RuntimeError("export and TCP fetches differ")
        t_tcp = timed(lambda: tcp.fetch(ns, tokens), repeat)
        t_reused = timed(lambda: lane.fetch(ns, tokens), repeat)
        first = []
        row = want_k[0][:1].astype("<f2").tobytes()
        raw = redis.Redis(port=port)
        for _ in range(repeat):
            # One row rewritten with its own value: the rows are unchanged, their
            # generation is not, so the next export writes the file again.
            raw.execute_command("V.STOREBATCH", f"{ns}_pk", 0, 0, 1, row, "FMT", "F16")
            t0 = time.perf_counter()
            lane.fetch(ns, tokens)
            first.append(time.perf_counter() - t0)
        if lane.export_lane.fallbacks:
            raise RuntimeError(f"the export lane fell back: {lane.export_lane}")
    finally:
        tcp.close()
        lane.close()
    return {"tcp_s": t_tcp, "export_reused_s": t_reused, "export_first_s": float(np.median(first))}


def _pion_client(
    port: int, ns: str, *, layers: int, tokens: int, kv_dim: int, repeat: int
) -> dict[str, float]:
    import mlx.core as mx
    from pion_vllm_mlx import prompt_cache

    pc = prompt_cache.PionPromptCache(model=None, host="127.0.0.1", port=port)
    pc.layout = prompt_cache.CacheLayout(n_layers=layers, n_kv_heads=8, head_dim=kv_dim // 8)

    def export_lane() -> None:
        arrays = mx.load(pc._export(ns, tokens))
        mx.eval(*arrays.values())

    def tcp_lane() -> None:
        for side in ("_pk", "_pv"):
            flat = pc._fetch_batch_all_layers(ns + side, tokens, layers, native_dim=kv_dim)
            mx.eval(
                *[
                    mx.array(
                        f.reshape(tokens, 8, kv_dim // 8).transpose(1, 0, 2)[None], dtype=mx.float16
                    )
                    for f in flat
                ]
            )

    export_lane()
    try:
        return {
            "pion_client_tcp_s": timed(tcp_lane, repeat),
            "pion_client_export_s": timed(export_lane, repeat),
        }
    finally:
        pc.resp.sock.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--kv-dim", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--pion-client", action="store_true", help="also time pion-vllm-mlx")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.tokens, args.kv_dim, args.repeat = 4, 256, 256, 3
    ns = "bench-export"
    pion = start_pion("--no-wal")
    try:
        _store(pion.port, ns, args.layers, args.tokens, args.kv_dim)
        ours = _ours(pion.port, ns, args.tokens, args.repeat)
        theirs: dict[str, Any] = {}
        if args.pion_client:
            theirs = _pion_client(
                pion.port,
                ns,
                layers=args.layers,
                tokens=args.tokens,
                kv_dim=args.kv_dim,
                repeat=args.repeat,
            )
    finally:
        pion.stop()
    mb = 2 * args.layers * args.tokens * args.kv_dim * 2 / 1e6
    rows = [
        ["tcp", ours["tcp_s"] * 1e3, 1.0],
        ["export (reused)", ours["export_reused_s"] * 1e3, ours["tcp_s"] / ours["export_reused_s"]],
        ["export (first)", ours["export_first_s"] * 1e3, ours["tcp_s"] / ours["export_first_s"]],
    ]
    if theirs:
        t = theirs["pion_client_tcp_s"]
        rows += [
            ["pion-vllm-mlx tcp", t * 1e3, 1.0],
            [
                "pion-vllm-mlx export",
                theirs["pion_client_export_s"] * 1e3,
                t / theirs["pion_client_export_s"],
            ],
        ]
    print(f"{args.layers} layers x {args.tokens} tokens x kv_dim {args.kv_dim}, fp16 ({mb:.0f} MB)")
    print_table(["lane", "ms", "x tcp"], rows)
    write_results(
        "export_fetch",
        {
            "layers": args.layers,
            "tokens": args.tokens,
            "kv_dim": args.kv_dim,
            "payload_mb": mb,
            "repeat": args.repeat,
            "quick": args.quick,
            **ours,
            **theirs,
            "speedup_reused": ours["tcp_s"] / ours["export_reused_s"],
            "speedup_first": ours["tcp_s"] / ours["export_first_s"],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
