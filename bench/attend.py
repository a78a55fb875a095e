"""Attention tier benchmarks (issue 11).

1. ``ATTEND.PREFIX.QUERY_FUSED`` latency over a 2048-token cached prefix (H_kv = 8,
   H_q = 32, D = 64 and 128, M = 1 and M = 16, a causal suffix of S_suf = M tokens),
   through Pion's own client (``pion-vllm-mlx``, numpy only) over the binary lane
   (port+1) and over RESP (``PION_PROMPT_CACHE_NO_BINARY=1``). Baselines measured in
   the same run: the same attention computed locally with numpy in the client process
   (the floor: no server at all) and one loopback round trip (a binary-lane PING).
   Target: M = 1 over the binary lane within 1.5x of (local floor + one round trip).
   The same prefix also goes through ``KV.PREFIX.WARM`` of fp16 rows (a slot holding the
   V-store's fp16 rows, widened per key block at query time): the ``warm16`` lane,
   binary, beside the fp32 slot ``ATTEND.PREFIX.STORE`` made (target: no slower).
2. ``KV.PREFIX.WARM`` of a 32-layer, 2048-token fp16 namespace (kv_dim 8 x 128): the
   slots hold the stored fp16 rows by reference. Target 50 ms (Pion publishes 50-200
   ms); for scale, the same run times the fp16 -> fp32 widening of those bytes done
   locally with numpy (what WARM did before it held rows by reference).

Prints a table and writes ``bench/results/attend.json``.
"""

from __future__ import annotations

import os

# One BLAS thread in this process and in the server it starts (inherited), set before
# numpy loads: OpenBLAS threads spin while they wait, so a client and a server each
# with a pool on the same few cores slow each other down by orders of magnitude for
# these small matrices. Operators get the same advice (docs/attention.md).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import redis  # noqa: E402
from pion_vllm_mlx.prompt_cache import PionPromptCache as PionsClient  # noqa: E402

from _common import print_table, start_pion, write_results  # noqa: E402
from pion.attend.kernel import attend  # noqa: E402

H_KV, H_Q, N = 8, 32, 2048
PION_WARM_MS = (50.0, 200.0)  # Pion's published range for KV.PREFIX.WARM
WARM_TARGET_MS = 50.0  # issue 24: 32 layers x 2048 tokens fp16


def _latencies(fn: Callable[[], object], calls: int, warmup: int) -> np.ndarray:
    for _ in range(warmup):
        fn()
    out = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        out[i] = time.perf_counter_ns() - t0
    return out / 1000.0  # microseconds


def _interleaved(
    fns: dict[str, Callable[[], object]], calls: int, warmup: int
) -> dict[str, np.ndarray]:
    """Latencies of several functions measured in turn, call after call, so a busy
    machine slows every one of them alike and their ratios stay meaningful. The order
    rotates each round: whichever call comes first after a pause pays for waking the
    server process up, and that must not always be the same one."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    out = {name: np.empty(calls) for name in fns}
    names = list(fns)
    for i in range(calls):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            fn = fns[name]
            t0 = time.perf_counter_ns()
            fn()
            out[name][i] = time.perf_counter_ns() - t0
    return {name: lat / 1000.0 for name, lat in out.items()}


def _stats(lat: np.ndarray) -> dict[str, float]:
    """p50 and p99, and the minimum: on a shared machine the fastest call is the best
    estimate of the uncontended cost (every delay another process causes adds time)."""
    return {
        "p50_us": float(np.median(lat)),
        "p99_us": float(np.percentile(lat, 99)),
        "min_us": float(lat.min()),
    }


def _ping_rtt(port: int, calls: int) -> np.ndarray:
    """One binary-lane PING frame and its reply: the loopback round-trip floor."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        frame = struct.pack("<HBI", 0xCA5E, 0xFF, 0)

        def ping() -> None:
            sock.sendall(frame)
            got = b""
            while len(got) < 7:
                got += sock.recv(7 - len(got))

        return _latencies(ping, calls, 200)


def _client(port: int, binary: bool) -> PionsClient:
    os.environ["PION_PROMPT_CACHE_NO_BINARY"] = "0" if binary else "1"
    return PionsClient(model=None, port=port)


def fused(port: int, calls: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rtt = _stats(_ping_rtt(port + 1, calls))
    rows = []
    lanes = {"binary": _client(port, True), "resp": _client(port, False)}
    hm = (np.arange(H_Q) // (H_Q // H_KV)).astype(np.uint8)
    r = redis.Redis(port=port)
    for d in (64, 128):
        # fp16-exact values, so the fp32 slot and the fp16 WARM slot hold the same K/V.
        k = rng.standard_normal((H_KV, N, d)).astype(np.float16).astype(np.float32)
        v = rng.standard_normal((H_KV, N, d)).astype(np.float16).astype(np.float32)
        lanes["resp"].attend_store_layer(f"bench{d}", 0, k, v)
        _warm_fp16(r, f"warm{d}", k, v)
        for m in (1, 16):
            q = rng.standard_normal((H_Q, m, d)).astype(np.float32)
            ks = rng.standard_normal((H_KV, m, d)).astype(np.float32)
            vs = rng.standard_normal((H_KV, m, d)).astype(np.float32)
            want = attend(q, k, v, head_map=hm.astype(np.intp), k_suf=ks, v_suf=vs).out
            fns: dict[str, Callable[[], object]] = {
                "local": lambda q=q, k=k, v=v, ks=ks, vs=vs: attend(
                    q, k, v, head_map=hm.astype(np.intp), k_suf=ks, v_suf=vs
                )
            }
            lane_ns = [("binary", "binary", "bench"), ("resp", "resp", "bench")]
            lane_ns.append(("warm16", "binary", "warm"))
            for name, lane, prefix in lane_ns:
                pc, ns = lanes[lane], f"{prefix}{d}"
                out = pc.attend_query_fused(ns, 0, q, ks, vs, hm)
                np.testing.assert_allclose(out, want, atol=1e-5)
                fns[name] = lambda pc=pc, ns=ns, q=q, ks=ks, vs=vs: pc.attend_query_fused(
                    ns, 0, q, ks, vs, hm
                )
            lat = _interleaved(fns, calls, 20)
            local = _stats(lat["local"])
            row: dict[str, Any] = {"d": d, "m": m, "s_suf": m, "local": local, "rtt": rtt}
            row["binary"], row["resp"] = _stats(lat["binary"]), _stats(lat["resp"])
            row["warm16"] = _stats(lat["warm16"])
            row["warm16_vs_binary"] = row["warm16"]["p50_us"] / row["binary"]["p50_us"]
            row["warm16_vs_binary_min"] = row["warm16"]["min_us"] / row["binary"]["min_us"]
            assert lanes["binary"]._binary is not None, "the binary lane was not used"
            floor = local["p50_us"] + rtt["p50_us"]
            row["binary_vs_floor_plus_rtt"] = row["binary"]["p50_us"] / floor
            best = local["min_us"] + rtt["min_us"]
            row["binary_vs_floor_plus_rtt_min"] = row["binary"]["min_us"] / best
            row["binary_vs_local"] = row["binary"]["p50_us"] / local["p50_us"]
            row["resp_vs_local"] = row["resp"]["p50_us"] / local["p50_us"]
            row["resp_vs_binary"] = row["resp"]["p50_us"] / row["binary"]["p50_us"]
            rows.append(row)
    r.close()
    return rows


def _warm_fp16(r: redis.Redis, ns: str, k: np.ndarray, v: np.ndarray) -> None:
    """``k``/``v`` [H, N, D] as an fp16 namespace's layer 0, warmed into ``<ns>_attn``."""
    h, n, d = k.shape
    r.execute_command("KV.PREFIX.REGISTER", ns, h * d, "fp16")
    for half, a in (("_pk", k), ("_pv", v)):
        rows = a.transpose(1, 0, 2).reshape(n, h * d).astype(np.float16)
        r.execute_command("V.STOREBATCH", ns + half, 0, 0, n, rows.tobytes(), "FMT", "F16")
    assert r.execute_command("KV.PREFIX.WARM", ns, h, d, ns + "_attn") == b"1"


def warm(port: int, repeat: int, layers: int) -> dict[str, Any]:
    h, d = 8, 128
    rng = np.random.default_rng(1)
    r = redis.Redis(port=port)
    ns = "warmbench"
    r.execute_command("KV.PREFIX.REGISTER", ns, h * d, "fp16")
    halves = []
    for layer in range(layers):
        for half in ("_pk", "_pv"):
            rows = rng.standard_normal((N, h * d)).astype(np.float16)
            halves.append(rows)
            r.execute_command("V.STOREBATCH", ns + half, layer, 0, N, rows.tobytes(), "FMT", "F16")

    def run() -> None:
        assert r.execute_command("KV.PREFIX.WARM", ns, h, d, ns + "_attn") == str(layers).encode()

    def local() -> None:
        # The floor: widen every half to fp32 (one cast each, one thread), in memory.
        for rows in halves:
            rows.astype(np.float32)

    lat = _interleaved({"server": run, "local": local}, repeat, 1)
    server_ms = float(np.median(lat["server"])) / 1000.0
    local_ms = float(np.median(lat["local"])) / 1000.0
    r.close()
    return {
        "layers": layers,
        "tokens": N,
        "kv_dim": h * d,
        "format": "fp16",
        "bytes_fp32": 2 * layers * N * h * d * 4,
        "server_ms": server_ms,
        "local_numpy_ms": local_ms,
        "server_vs_local": server_ms / local_ms,
        "pion_published_ms": PION_WARM_MS,
        "server_vs_pion_low": server_ms / PION_WARM_MS[0],
        "target_ms": WARM_TARGET_MS,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke sizes")
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    calls = 30 if args.quick else args.calls
    pion = start_pion("--no-wal", "--attend-slots", "256")
    try:
        rows = fused(pion.port, calls)
        w = warm(pion.port, 3 if args.quick else 7, 4 if args.quick else 32)
    finally:
        pion.stop()
    print_table(
        [
            "D",
            "M",
            "local p50",
            "rtt p50",
            "binary p50",
            "resp p50",
            "warm16 p50",
            "warm16/bin",
            "bin/(loc+rtt)",
            "resp/loc",
            "bin/(loc+rtt) min",
        ],
        [
            [
                r["d"],
                r["m"],
                r["local"]["p50_us"],
                r["rtt"]["p50_us"],
                r["binary"]["p50_us"],
                r["resp"]["p50_us"],
                r["warm16"]["p50_us"],
                r["warm16_vs_binary"],
                r["binary_vs_floor_plus_rtt"],
                r["resp_vs_local"],
                r["binary_vs_floor_plus_rtt_min"],
            ]
            for r in rows
        ],
    )
    print()
    print_table(
        ["WARM layers", "tokens", "server ms", "local numpy ms", "server/local", "Pion ms"],
        [
            [
                w["layers"],
                w["tokens"],
                w["server_ms"],
                w["local_numpy_ms"],
                w["server_vs_local"],
                "50-200",
            ]
        ],
    )
    write_results(
        "attend",
        {
            "quick": args.quick,
            "calls": calls,
            "client": "pion-vllm-mlx attend_query_fused (numpy only)",
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
            "load_average": os.getloadavg(),
            "method": "medians of interleaved calls (local, binary, resp in turn)",
            "prefix": {"tokens": N, "h_kv": H_KV, "h_q": H_Q},
            "query_fused": rows,
            "warm": w,
        },
    )


if __name__ == "__main__":
    main()
