"""Registry benchmarks (issue 3).

1. KV.PREFIX.MEMBERSHIP with K = N = 1562 hashes (100k tokens at block size 64):
   end-to-end latency from redis-py with hiredis over loopback, p50/p99 over --calls
   calls after warm-up. Pion publishes 125 us p50 / 270 us p99 (Apple Silicon); our
   target is p50 <= 100 us, p99 <= 250 us. As same-run references, redis-server GET of
   a value the size of the request (12.5 KB) through the same client, and PING to both
   servers (the machine's loopback round-trip floor).
2. KV.PREFIX.LOOKUP throughput with redis-benchmark (50 clients, unpipelined and -P 16)
   against redis-server GET in the same run. Target: >= 0.5x unpipelined.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time

import numpy as np
import redis

from _common import print_table, start_pion, start_redis, write_results

# Where the MEMBERSHIP latency distributions are sampled (BENCHMARKS.md plots the CDF).
CDF_QUANTILES = (1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 98, 99, 99.5, 99.9)


def _latencies(fn: object, calls: int, warmup: int) -> np.ndarray:
    call = fn  # type: ignore[assignment]
    for _ in range(warmup):
        call()  # type: ignore[operator]
    out = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter_ns()
        call()  # type: ignore[operator]
        out[i] = time.perf_counter_ns() - t0
    return out / 1000.0  # microseconds


def membership(calls: int) -> dict[str, float]:
    n = 1562
    rng = np.random.default_rng(7)
    table = rng.integers(0, 2**63, size=n, dtype=np.uint64).astype("<u8")
    probes = np.concatenate(
        [table[: n // 2], rng.integers(2**63, 2**64 - 1, n - n // 2, dtype=np.uint64)]
    )
    probe_blob = probes.astype("<u8").tobytes()
    pion = start_pion("--no-wal")
    baseline = start_redis()
    try:
        r = redis.Redis(port=pion.port)
        r.execute_command(
            "KV.PREFIX.REGISTER", "bench", 1024, "fp16", "BLOCKS", 64, n, table.tobytes()
        )
        expected = r.execute_command("KV.PREFIX.MEMBERSHIP", "bench", n, probe_blob)
        assert len(expected) == (n + 7) // 8
        lat = _latencies(
            lambda: r.execute_command("KV.PREFIX.MEMBERSHIP", "bench", n, probe_blob), calls, 1000
        )
        pion_ping = _latencies(r.ping, calls, 1000)
        b = redis.Redis(port=baseline.port)
        b.set("k", probe_blob)
        base = _latencies(lambda: b.get("k"), calls, 1000)
        base_ping = _latencies(b.ping, calls, 1000)
    finally:
        pion.stop()
        baseline.stop()
    return {
        "p50_us": float(np.percentile(lat, 50)),
        "p99_us": float(np.percentile(lat, 99)),
        "redis_get_12k_p50_us": float(np.percentile(base, 50)),
        "redis_get_12k_p99_us": float(np.percentile(base, 99)),
        # The loopback floor of this machine: a round trip that does no work.
        "pion_ping_p50_us": float(np.percentile(pion_ping, 50)),
        "redis_ping_p50_us": float(np.percentile(base_ping, 50)),
        "cdf_quantiles": list(CDF_QUANTILES),
        "cdf_pion_us": [float(x) for x in np.percentile(lat, CDF_QUANTILES)],
        "cdf_redis_us": [float(x) for x in np.percentile(base, CDF_QUANTILES)],
    }


_RPS = re.compile(r"([\d.]+) requests per second")


def _benchmark(port: int, requests: int, pipeline: int, *cmd: str) -> float:
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(port),
            "-c",
            "50",
            "-n",
            str(requests),
            "-P",
            str(pipeline),
            "-q",
            *cmd,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    m = _RPS.findall(out)
    if not m:
        raise RuntimeError(f"could not parse redis-benchmark output: {out!r}")
    return float(m[-1])


def lookup_throughput(requests: int) -> dict[str, float]:
    pion = start_pion("--no-wal")
    baseline = start_redis()
    try:
        r = redis.Redis(port=pion.port)
        r.execute_command("KV.PREFIX.REGISTER", "bench", 1024, "fp16")
        redis.Redis(port=baseline.port).set("bench", "x" * 16)
        out = {}
        for p in (1, 16):
            out[f"pion_lookup_rps_P{p}"] = _benchmark(
                pion.port, requests, p, "KV.PREFIX.LOOKUP", "bench"
            )
            out[f"redis_get_rps_P{p}"] = _benchmark(baseline.port, requests, p, "GET", "bench")
            out[f"ratio_P{p}"] = out[f"pion_lookup_rps_P{p}"] / out[f"redis_get_rps_P{p}"]
    finally:
        pion.stop()
        baseline.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=10_000, help="MEMBERSHIP calls timed")
    ap.add_argument("--requests", type=int, default=200_000, help="redis-benchmark requests")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.calls, args.requests = 1000, 20_000
    mem = membership(args.calls)
    thr = lookup_throughput(args.requests)
    print_table(
        ["benchmark", "pion", "redis-server", "target"],
        [
            ["MEMBERSHIP K=N=1562 p50 (us)", mem["p50_us"], mem["redis_get_12k_p50_us"], "<= 100"],
            ["MEMBERSHIP K=N=1562 p99 (us)", mem["p99_us"], mem["redis_get_12k_p99_us"], "<= 250"],
            [
                "PING p50 (us), the loopback floor",
                mem["pion_ping_p50_us"],
                mem["redis_ping_p50_us"],
                "",
            ],
            [
                "LOOKUP rps, -c 50",
                thr["pion_lookup_rps_P1"],
                thr["redis_get_rps_P1"],
                f">= 0.5x (got {thr['ratio_P1']:.2f}x)",
            ],
            [
                "LOOKUP rps, -c 50 -P 16",
                thr["pion_lookup_rps_P16"],
                thr["redis_get_rps_P16"],
                f"(got {thr['ratio_P16']:.2f}x)",
            ],
        ],
    )
    write_results(
        "registry",
        {"membership": mem, "lookup": thr, "calls": args.calls, "requests": args.requests},
    )


if __name__ == "__main__":
    main()
