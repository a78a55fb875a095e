"""V-store throughput per format against redis-server, and the server's memory.

For each storage format: ``V.STOREBATCH`` of L layers x T tokens x D dims of fp32 (one
command per layer, pipelined) and ``V.FETCH <sid> BATCH 0 T L`` (one command), against
``SET``/``GET`` of the same fp32 bytes (one key per layer, pipelined) on a throwaway
``redis-server`` through the same redis-py client, in the same run. Throughput is
counted in fp32 payload bytes for both sides, so ``x redis`` is a plain time ratio. An
extra row, ``fp16/F16``, is the production path of Pion's clients: ``FMT F16`` in,
``FMT NATIVE`` out (half the wire bytes).

Memory: each format gets a fresh ``pion-server``; after the load we read its peak RSS
(the kernel's VmHWM) and ``vstore_bytes`` (INFO memory). ``peak/vstore`` includes the
interpreter (its idle RSS is shown); ``(peak-idle)/vstore`` is what the store costs.
``bound`` is the documented in-flight bound of a pipelined store
(``pion.commands.vstore.store_in_flight_bound``: two commands' blobs, i.e. two layers
in flight, one command's stored rows, the receive buffers), and ``within`` says
whether ``peak - idle <= 1.3 x vstore_bytes + bound``.

``bf16_rope_fp8_body`` exists per layer only: its session is created with ``V.CREATE
... SCHEMA`` (every layer ``rope=64``), the rest is the same.

Server CPU: seconds of CPU (user + system) each server spent on one store and one
fetch, from psutil: on a machine whose cores the client shares (and others load),
the wall-time ratio follows this closely, so it is reported beside it.

Targets (issue 24): every format's store >= 1.0x redis SET, every fetch (the turbo
formats included) >= 1.0x redis GET; peak RSS less idle within 1.3x of vstore_bytes
plus the in-flight bound (two layers in flight), for every format.

    python bench/vstore_throughput.py            # 16 x 4096 x 1024, every format
    python bench/vstore_throughput.py --quick    # CI-sized
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Process, print_table, start_pion, start_redis, timed, write_results
from pion.codecs import get_codec
from pion.commands.vstore import store_in_flight_bound

FORMATS = ("fp16", "fp8", "int8", "mlx4g32", "turbo4", "turbo3", "turbo2", "bf16_rope_fp8_body")
# The rotary prefix of bf16_rope_fp8_body layers (DeepSeek's MLA keeps 64 dims of RoPE).
ROPE = 64
MB = 1e6


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=600)


def _cpu(proc: Process) -> float:
    times = proc.ps.cpu_times()
    return float(times.user + times.system)


def _cpu_of(proc: Process, fn: Any) -> float:
    """Server CPU seconds one call of ``fn`` cost."""
    before = _cpu(proc)
    fn()
    return _cpu(proc) - before


def redis_baseline(proc: Process, blobs: Sequence[bytes], repeat: int) -> dict[str, float]:
    r = _client(proc.port)

    def store() -> None:
        pipe = r.pipeline(transaction=False)
        for i, blob in enumerate(blobs):
            pipe.set(f"layer:{i}", blob)
        pipe.execute()

    def fetch() -> None:
        pipe = r.pipeline(transaction=False)
        for i in range(len(blobs)):
            pipe.get(f"layer:{i}")
        out = pipe.execute()
        if [len(b) for b in out] != [len(b) for b in blobs]:
            raise RuntimeError("redis GET returned the wrong sizes")

    store()
    result = {"store_s": timed(store, repeat), "fetch_s": timed(fetch, repeat)}
    result["store_cpu_s"] = _cpu_of(proc, store)
    result["fetch_cpu_s"] = _cpu_of(proc, fetch)
    r.close()
    return result


def pion_run(
    fmt: str,
    blobs: Sequence[bytes],
    *,
    f16: bool,
    shape: tuple[int, int, int],
    repeat: int,
    wal: bool,
) -> dict[str, Any]:
    layers, tokens, dim = shape
    server = start_pion(*([] if wal else ["--no-wal"]))
    try:
        c = _client(server.port)
        idle = server.rss()
        rope = ROPE if fmt == "bf16_rope_fp8_body" else 0
        if rope:
            spec = f"fmt={fmt},dim={dim},rope={rope}"
            c.execute_command("V.CREATE", "bench", 0, "SCHEMA", layers, *[spec] * layers)
        else:
            c.execute_command("V.CREATE", "bench", dim, "VQUANT", fmt)
        extra = ("FMT", "F16") if f16 else ()

        def store() -> None:
            pipe = c.pipeline(transaction=False)
            for i, blob in enumerate(blobs):
                pipe.execute_command("V.STOREBATCH", "bench", i, 0, tokens, blob, *extra)
            pipe.execute()

        want = tokens * dim * (2 if f16 and fmt == "fp16" else 4)

        def fetch() -> None:
            native = ("FMT", "NATIVE") if f16 else ()
            out = c.execute_command("V.FETCH", "bench", "BATCH", 0, tokens, layers, *native)
            if [len(b) for b in out] != [want] * layers:
                raise RuntimeError("V.FETCH BATCH returned the wrong sizes")

        store()
        store_s = timed(store, repeat)
        peak = server.peak_rss()
        vstore_bytes = int(c.info("memory")["vstore_bytes"])
        fetch_s = timed(fetch, repeat)
        store_cpu_s = _cpu_of(server, store)
        fetch_cpu_s = _cpu_of(server, fetch)
        c.close()
        codec = get_codec(fmt, rope)
        stored_per_command = tokens * codec.row_bytes(dim)
        return {
            "store_s": store_s,
            "fetch_s": fetch_s,
            "store_cpu_s": store_cpu_s,
            "fetch_cpu_s": fetch_cpu_s,
            "vstore_bytes": vstore_bytes,
            "rss_idle": idle,
            "rss_peak_after_load": peak,
            "in_flight_bound": store_in_flight_bound(
                len(blobs[0]), stored_per_command, compiled=codec.compiled
            ),
            "compiled_codec": codec.compiled,
        }
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3, help="timed runs per figure (median)")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--quick", action="store_true", help="4 x 512 x 256, 2 repeats (CI)")
    p.add_argument("--wal", action="store_true", help="keep the write-ahead log on")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.tokens, args.dim, args.repeat = 4, 512, 256, 2
    shape = (args.layers, args.tokens, args.dim)
    rng = np.random.default_rng(args.seed)
    data = [rng.standard_normal(shape[1:]).astype("<f4") for _ in range(args.layers)]
    blobs32 = [d.tobytes() for d in data]
    payload = sum(len(b) for b in blobs32)

    # The baseline is measured right before each format, so a machine whose load
    # drifts during the run still yields fair ratios.
    baseline = start_redis()
    runs: list[dict[str, Any]] = []
    try:
        for fmt in args.formats.split(","):
            opts = {"shape": shape, "repeat": args.repeat, "wal": args.wal}
            variants = [(fmt, blobs32, False)]
            if fmt == "fp16":
                variants.append(("fp16/F16", [d.astype("<f2").tobytes() for d in data], True))
            for name, blobs, f16 in variants:
                base = redis_baseline(baseline, blobs32, args.repeat)
                run = pion_run(fmt, blobs, f16=f16, **opts)
                runs.append({"format": name, "redis": base, **run})
    finally:
        baseline.stop()

    table = []
    for run in runs:
        base = run["redis"]
        run["store_mb_s"] = payload / run["store_s"] / MB
        run["fetch_mb_s"] = payload / run["fetch_s"] / MB
        run["redis_set_mb_s"] = payload / base["store_s"] / MB
        run["redis_get_mb_s"] = payload / base["fetch_s"] / MB
        run["store_x_redis"] = base["store_s"] / run["store_s"]
        run["fetch_x_redis"] = base["fetch_s"] / run["fetch_s"]
        vb = max(run["vstore_bytes"], 1)
        run["peak_over_vstore"] = run["rss_peak_after_load"] / vb
        cost = run["rss_peak_after_load"] - run["rss_idle"]
        run["store_cost_over_vstore"] = cost / vb
        run["peak_within_bound"] = cost <= 1.3 * run["vstore_bytes"] + run["in_flight_bound"]
        table.append(
            [
                run["format"],
                run["store_mb_s"],
                run["redis_set_mb_s"],
                run["store_x_redis"],
                run["fetch_mb_s"],
                run["redis_get_mb_s"],
                run["fetch_x_redis"],
                run["vstore_bytes"] / MB,
                run["rss_idle"] / MB,
                run["rss_peak_after_load"] / MB,
                run["peak_over_vstore"],
                run["store_cost_over_vstore"],
                run["in_flight_bound"] / MB,
                "yes" if run["peak_within_bound"] else "NO",
                f"{run['store_cpu_s']:.2f}/{base['store_cpu_s']:.2f}",
                f"{run['fetch_cpu_s']:.2f}/{base['fetch_cpu_s']:.2f}",
            ]
        )
    print(
        f"V-store throughput: {args.layers} layers x {args.tokens} tokens x dim {args.dim} "
        f"({payload / MB:.0f} MB fp32), median of {args.repeat}; MB/s of fp32 payload"
    )
    print_table(
        [
            "format",
            "STOREBATCH",
            "redis SET",
            "x",
            "FETCH BATCH",
            "redis GET",
            "x",
            "vstore MB",
            "idle RSS",
            "peak RSS",
            "peak/vstore",
            "(peak-idle)/vstore",
            "bound MB",
            "within",
            "store CPU s pion/redis",
            "fetch CPU s pion/redis",
        ],
        table,
    )
    path = write_results(
        "vstore_throughput",
        {
            "config": {**vars(args), "payload_bytes": payload},
            "pion": runs,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
