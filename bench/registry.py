"""Registry benchmarks (issues 3 and 13).

1. Server-side, in process: KV.PREFIX.MEMBERSHIP with K = N = 1562 hashes (100k
   tokens at block size 64) and KV.PREFIX.LOOKUP through the dispatcher, p50/p99 per
   call, no socket. Issue 13 target: MEMBERSHIP under 20 us.
2. KV.PREFIX.MEMBERSHIP end to end from redis-py (hiredis parser) over loopback,
   p50/p99 over --calls calls after warm-up, against redis-server SET of the same
   12.5 KB blob through the same client (issue 13: p50 within 1.5x, p99 within 2x);
   GET of it and PING to both servers (the loopback floor) for reference. The calls of
   every series are interleaved, so load from elsewhere on the machine falls on all. Pion
   publishes 125 us p50 / 270 us p99 (Apple Silicon).
3. KV.PREFIX.LOOKUP throughput with redis-benchmark (50 clients, unpipelined and -P 16,
   one server process) against redis-server GET in the same run. Issue 13 targets:
   >= 0.7x unpipelined, >= 0.3x at -P 16.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np
import redis

from _common import cpu_seconds, print_table, start_pion, start_redis, write_results
from pion.commands import COMMAND_TABLE
from pion.commands.state import ClientState, Context
from pion.config import ServerConfig
from pion.resp.scan import COMPILED as SCAN_COMPILED
from pion.server.dispatch import dispatch
from pion.server.run import build_state
from pion.vstore.views import COMPILED as MEMBERSHIP_COMPILED

# Where the MEMBERSHIP latency distributions are sampled (BENCHMARKS.md plots the CDF).
CDF_QUANTILES = (1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 98, 99, 99.5, 99.9)


def _latencies(
    fns: dict[str, Callable[[], object]], calls: int, warmup: int
) -> dict[str, np.ndarray]:
    """Per-call microseconds of each of ``fns``, the calls interleaved (one of each in
    turn), so a burst of load on the machine hits every series alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out = {name: np.empty(calls) for name in fns}
    for i in range(calls):
        for name, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            out[name][i] = time.perf_counter_ns() - t0
    return {name: times / 1000.0 for name, times in out.items()}


def _tables() -> tuple[np.ndarray, bytes]:
    """A 1562-hash table and 1562 probes, half of them its prefix (a shared prompt)."""
    n = 1562
    rng = np.random.default_rng(7)
    table = rng.integers(0, 2**63, size=n, dtype=np.uint64).astype("<u8")
    probes = np.concatenate(
        [table[: n // 2], rng.integers(2**63, 2**64 - 1, n - n // 2, dtype=np.uint64)]
    )
    return table, probes.astype("<u8").tobytes()


def _per_call_us(fn: Callable[[], object], calls: int) -> np.ndarray:
    for _ in range(1000):
        fn()
    out = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        out[i] = time.perf_counter_ns() - t0
    return out / 1000.0


def in_process(calls: int) -> dict[str, float]:
    """MEMBERSHIP and LOOKUP through the dispatcher, no socket."""
    config = dataclasses.replace(
        ServerConfig(), port=0, dir=tempfile.mkdtemp(prefix="pion-bench-"), wal_enabled=False
    )
    state = build_state(config)
    if state.persistence is not None:
        state.persistence.close()
        state.persistence = None
    state.loading = False
    ctx = Context(state=state, client=ClientState(id=1), table=COMMAND_TABLE)
    table, probe_blob = _tables()
    n = len(table)
    dispatch(
        ctx,
        [
            b"KV.PREFIX.REGISTER",
            b"bench",
            b"1024",
            b"fp16",
            b"BLOCKS",
            b"64",
            b"%d" % n,
            table.tobytes(),
        ],
    )
    member = [b"KV.PREFIX.MEMBERSHIP", b"bench", b"%d" % n, probe_blob]
    lookup = [b"KV.PREFIX.LOOKUP", b"bench"]
    m = _per_call_us(lambda: dispatch(ctx, member), calls)
    lk = _per_call_us(lambda: dispatch(ctx, lookup), calls)
    return {
        "membership_p50_us": float(np.percentile(m, 50)),
        "membership_p99_us": float(np.percentile(m, 99)),
        "lookup_p50_us": float(np.percentile(lk, 50)),
        "lookup_p99_us": float(np.percentile(lk, 99)),
    }


def membership(calls: int) -> dict[str, float]:
    table, probe_blob = _tables()
    n = len(table)
    pion = start_pion("--no-wal")
    baseline = start_redis()
    try:
        r = redis.Redis(port=pion.port)
        r.execute_command(
            "KV.PREFIX.REGISTER", "bench", 1024, "fp16", "BLOCKS", 64, n, table.tobytes()
        )
        expected = r.execute_command("KV.PREFIX.MEMBERSHIP", "bench", n, probe_blob)
        assert len(expected) == (n + 7) // 8
        b = redis.Redis(port=baseline.port)
        series = _latencies(
            {
                "membership": lambda: r.execute_command(
                    "KV.PREFIX.MEMBERSHIP", "bench", n, probe_blob
                ),
                "set": lambda: b.set("k", probe_blob),
                "get": lambda: b.get("k"),
                "pion_ping": r.ping,
                "redis_ping": b.ping,
            },
            calls,
            1000,
        )
        lat, base_set, base = series["membership"], series["set"], series["get"]
        pion_ping, base_ping = series["pion_ping"], series["redis_ping"]
    finally:
        pion.stop()
        baseline.stop()
    return {
        "p50_us": float(np.percentile(lat, 50)),
        "p99_us": float(np.percentile(lat, 99)),
        "redis_set_12k_p50_us": float(np.percentile(base_set, 50)),
        "redis_set_12k_p99_us": float(np.percentile(base_set, 99)),
        "redis_get_12k_p50_us": float(np.percentile(base, 50)),
        "redis_get_12k_p99_us": float(np.percentile(base, 99)),
        # The loopback floor of this machine: a round trip that does no work.
        "pion_ping_p50_us": float(np.percentile(pion_ping, 50)),
        "redis_ping_p50_us": float(np.percentile(base_ping, 50)),
        "cdf_quantiles": list(CDF_QUANTILES),
        "cdf_pion_us": [float(x) for x in np.percentile(lat, CDF_QUANTILES)],
        "cdf_redis_us": [float(x) for x in np.percentile(base, CDF_QUANTILES)],
        "cdf_redis_set_us": [float(x) for x in np.percentile(base_set, CDF_QUANTILES)],
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
        # Beside each rate, the server's CPU time (user + system) per request: on a
        # shared machine rates follow each process's share of the CPU, CPU time is what
        # the server spends.
        for p in (1, 16):
            cpu0 = cpu_seconds(pion)
            out[f"pion_lookup_rps_P{p}"] = _benchmark(
                pion.port, requests, p, "KV.PREFIX.LOOKUP", "bench"
            )
            out[f"pion_lookup_cpu_us_P{p}"] = (cpu_seconds(pion) - cpu0) * 1e6 / requests
            cpu0 = cpu_seconds(baseline)
            out[f"redis_get_rps_P{p}"] = _benchmark(baseline.port, requests, p, "GET", "bench")
            out[f"redis_get_cpu_us_P{p}"] = (cpu_seconds(baseline) - cpu0) * 1e6 / requests
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
    local = in_process(args.calls)
    mem = membership(args.calls)
    thr = lookup_throughput(args.requests)
    mem["p50_x_set"] = mem["p50_us"] / mem["redis_set_12k_p50_us"]
    mem["p99_x_set"] = mem["p99_us"] / mem["redis_set_12k_p99_us"]
    print(
        f"compiled twins: scanner {'yes' if SCAN_COMPILED else 'no'}, "
        f"membership {'yes' if MEMBERSHIP_COMPILED else 'no'}"
    )
    print_table(
        ["benchmark", "pion", "redis-server", "target"],
        [
            [
                "MEMBERSHIP K=N=1562 in process p50 (us)",
                local["membership_p50_us"],
                "",
                "< 20",
            ],
            ["MEMBERSHIP in process p99 (us)", local["membership_p99_us"], "", ""],
            ["LOOKUP in process p50 (us)", local["lookup_p50_us"], "", ""],
            [
                "MEMBERSHIP K=N=1562 p50 (us) vs SET 12.5 KB",
                mem["p50_us"],
                mem["redis_set_12k_p50_us"],
                f"<= 1.5x (got {mem['p50_x_set']:.2f}x)",
            ],
            [
                "MEMBERSHIP K=N=1562 p99 (us) vs SET 12.5 KB",
                mem["p99_us"],
                mem["redis_set_12k_p99_us"],
                f"<= 2x (got {mem['p99_x_set']:.2f}x)",
            ],
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
                f">= 0.7x (got {thr['ratio_P1']:.2f}x)",
            ],
            [
                "LOOKUP rps, -c 50 -P 16",
                thr["pion_lookup_rps_P16"],
                thr["redis_get_rps_P16"],
                f">= 0.3x (got {thr['ratio_P16']:.2f}x)",
            ],
            *(
                [
                    f"LOOKUP server CPU us/req{' -P 16' if p == 16 else ''}",
                    thr[f"pion_lookup_cpu_us_P{p}"],
                    thr[f"redis_get_cpu_us_P{p}"],
                    "",
                ]
                for p in (1, 16)
            ),
        ],
    )
    write_results(
        "registry",
        {
            "in_process": local,
            "membership": mem,
            "lookup": thr,
            "calls": args.calls,
            "requests": args.requests,
            "compiled": {"scanner": SCAN_COMPILED, "membership": MEMBERSHIP_COMPILED},
        },
    )


if __name__ == "__main__":
    main()
