"""Multi-worker throughput (issue 12): redis-benchmark against pion-server ``-w 1``,
``-w 2 --independent-workers`` and redis-server, all in the same run.

Measures (50 clients in all; every server without persistence, as the baseline):

1. ``KV.PREFIX.LOOKUP`` of a registered namespace, unpipelined and ``-P 16``: one
   redis-benchmark on the main port. Under ``-w 2`` the kernel spreads the clients over
   both workers; the namespace lives on worker 0, so worker 1 answers from the shared
   directory. Baseline: redis-server ``GET`` of a 16-byte value.
2. ``KV.PREFIX.MEMBERSHIP`` of 8 probes against a 64-hash table, unpipelined.
   Baseline: ``SMISMEMBER`` of the same 8 members of a 64-member set.
3. ``V.FETCH <sid> BATCH 0 16``: 4 layers x 16 rows x 64 fp16 values, a 16 KiB reply,
   unpipelined. Baseline: ``GET`` of a 16 KiB value.

MEMBERSHIP and V.FETCH run the way a cache-aware router runs them: pinned to the worker
that owns the namespace. So for those two, two redis-benchmark processes of 25 clients
each run at once; under ``-w 2`` each drives one worker's affinity port (worker i owns
the namespace it is sent), under ``-w 1`` and for redis-server both drive the one port.

Also measured: the cost of one cross-worker directory lookup inside a worker, from
its per-generation cache and through the locked table read (what the cache saves).

Each server and measure is run ``--rounds`` times, interleaved, and the best is kept
(the machine is shared; the best run is the least disturbed one). Reported: requests
per second, each pion figure over redis-server's, and ``-w 2`` over ``-w 1`` (2.0 would
be perfect scaling). Target on 2 cores: ``-w 2`` LOOKUP unpipelined >= 0.9x
redis-server.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import redis

from _common import Process, print_table, start_pion, start_redis, timed, write_results
from pion.server.directory import Directory, DirectoryTable

# Probe hashes whose little-endian bytes are printable, so redis-benchmark can send
# them as a command-line argument.
PROBES = [int.from_bytes(b"probe%03d" % i, "little") for i in range(8)]
TABLE = PROBES + [int.from_bytes(b"table%03d" % i, "little") for i in range(56)]
PROBE_ARG = b"".join(p.to_bytes(8, "little") for p in PROBES).decode()
LAYERS, ROWS, DIM = 4, 16, 64
_RPS = re.compile(r"([\d.]+) requests per second")


def _bench(port: int, clients: int, requests: int, pipeline: int, cmd: Sequence[str]) -> float:
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests),
         "-P", str(pipeline), "-q", *cmd],
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    ).stdout  # fmt: skip
    found = _RPS.findall(out)
    if not found:
        raise RuntimeError(f"could not parse redis-benchmark output: {out!r}")
    return float(found[-1])


def _pair(jobs: Sequence[tuple[int, Sequence[str]]], requests: int) -> float:
    """Two redis-benchmark processes of 25 clients at once; their summed rate."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        rates = pool.map(lambda job: _bench(job[0], 25, requests // 2, 1, job[1]), jobs)
        return sum(rates)


def _prepare_pion(r: redis.Redis, ns: str) -> None:
    blob = np.array(TABLE, dtype="<u8").tobytes()
    r.execute_command("KV.PREFIX.REGISTER", ns, DIM, "fp16", "BLOCKS", 16, len(TABLE), blob)
    rows = np.random.default_rng(1).standard_normal((ROWS, DIM)).astype(np.float32)
    for layer in range(LAYERS):
        r.execute_command("V.STOREBATCH", f"{ns}_pk", layer, 0, ROWS, rows.tobytes())
    reply = r.execute_command("V.FETCH", f"{ns}_pk", "BATCH", 0, ROWS)
    assert [len(x) for x in reply] == [ROWS * DIM * 4] * LAYERS
    assert r.execute_command("KV.PREFIX.MEMBERSHIP", ns, 8, PROBE_ARG) == b"\xff"


class Target:
    """One server under test and how each measure addresses it."""

    def __init__(self, name: str, proc: Process, workers: int) -> None:
        self.name = name
        self.proc = proc
        self.workers = workers

    def ports(self) -> list[int]:
        """The port each of the two pinned benchmark processes drives."""
        if self.workers == 2:
            return [self.proc.port + 2, self.proc.port + 3]  # the affinity ports
        return [self.proc.port, self.proc.port]

    def prepare(self) -> None:
        if self.name == "redis-server":
            r = redis.Redis(port=self.proc.port)
            r.set("bench", "x" * 16)
            r.set("blob", b"\x00" * (LAYERS * ROWS * DIM * 4))
            r.sadd("members", *[p.to_bytes(8, "little") for p in TABLE])
            return
        _prepare_pion(redis.Redis(port=self.ports()[0]), "ns0")
        _prepare_pion(redis.Redis(port=self.ports()[1]), "ns1")
        # The LOOKUP namespace lives on worker 0 only (-w 2): worker 1 answers from
        # the directory.
        redis.Redis(port=self.ports()[0]).execute_command("KV.PREFIX.REGISTER", "bench", 8, "fp16")

    def lookup(self, requests: int, pipeline: int) -> float:
        cmd = ["GET", "bench"] if self.name == "redis-server" else ["KV.PREFIX.LOOKUP", "bench"]
        return _bench(self.proc.port, 50, requests, pipeline, cmd)

    def membership(self, requests: int) -> float:
        if self.name == "redis-server":
            cmd = ["SMISMEMBER", "members", *(PROBE_ARG[i : i + 8] for i in range(0, 64, 8))]
            return _pair([(p, cmd) for p in self.ports()], requests)
        jobs = [(p, ["KV.PREFIX.MEMBERSHIP", f"ns{i}", "8", PROBE_ARG])
                for i, p in enumerate(self.ports())]  # fmt: skip
        return _pair(jobs, requests)

    def fetch(self, requests: int) -> float:
        if self.name == "redis-server":
            return _pair([(p, ["GET", "blob"]) for p in self.ports()], requests)
        jobs = [(p, ["V.FETCH", f"ns{i}_pk", "BATCH", "0", str(ROWS)])
                for i, p in enumerate(self.ports())]  # fmt: skip
        return _pair(jobs, requests)


def directory_lookup_us(calls: int) -> dict[str, float]:
    """Microseconds per cross-worker lookup: cached, and through the locked read."""
    table = DirectoryTable.create(1024)
    try:
        Directory(table, 0).claim(b"bench", 0, 8)
        reader = Directory(table, 1)
        cached = timed(lambda: [reader.remote(b"bench") for _ in range(calls)], 3)
        locked = timed(lambda: [table.read(b"bench") for _ in range(calls)], 3)
    finally:
        table.close()
    return {"cached_us": cached / calls * 1e6, "locked_us": locked / calls * 1e6}


def run(requests: int, rounds: int) -> dict[str, dict[str, float]]:
    targets = [
        Target("redis-server", start_redis(), 1),
        Target("pion -w 1", start_pion("--no-wal"), 1),
        Target("pion -w 2", start_pion("--no-wal", "-w", "2", "--independent-workers"), 2),
    ]
    best: dict[str, dict[str, float]] = {t.name: {} for t in targets}
    try:
        for t in targets:
            t.prepare()
        measures: dict[str, Any] = {
            "lookup_P1": lambda t: t.lookup(requests, 1),
            "lookup_P16": lambda t: t.lookup(requests * 4, 16),
            "membership_P1": lambda t: t.membership(requests),
            "fetch_batch_P1": lambda t: t.fetch(requests // 2),
        }
        for _ in range(rounds):
            for measure, fn in measures.items():
                for t in targets:
                    rps = fn(t)
                    best[t.name][measure] = max(best[t.name].get(measure, 0.0), rps)
    finally:
        for t in targets:
            t.proc.stop()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=200_000, help="requests per run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (best kept)")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.rounds = 20_000, 1
    directory = directory_lookup_us(20_000 if args.quick else 200_000)
    best = run(args.requests, args.rounds)
    redis_rps, w1, w2 = best["redis-server"], best["pion -w 1"], best["pion -w 2"]
    ratios = {
        m: {
            "w1_vs_redis": w1[m] / redis_rps[m],
            "w2_vs_redis": w2[m] / redis_rps[m],
            "w2_vs_w1": w2[m] / w1[m],
        }
        for m in redis_rps
    }
    labels = {
        "lookup_P1": "LOOKUP -c 50",
        "lookup_P16": "LOOKUP -c 50 -P 16",
        "membership_P1": "MEMBERSHIP 8 probes -c 2x25",
        "fetch_batch_P1": "V.FETCH BATCH 16 KiB -c 2x25",
    }
    print_table(
        ["measure (rps)", "redis-server", "pion -w 1", "pion -w 2", "w1/redis", "w2/redis",
         "w2/w1"],
        [
            [labels[m], redis_rps[m], w1[m], w2[m], r["w1_vs_redis"], r["w2_vs_redis"],
             r["w2_vs_w1"]]
            for m, r in ratios.items()
        ],
    )  # fmt: skip
    print(
        f"directory lookup in a worker: {directory['cached_us']:.2f} us cached, "
        f"{directory['locked_us']:.2f} us through the locked read"
    )
    target = ratios["lookup_P1"]["w2_vs_redis"]
    print(f"target: -w 2 LOOKUP unpipelined >= 0.90x redis-server; got {target:.2f}x")
    write_results(
        "workers",
        {
            "rps": best,
            "ratios": ratios,
            "directory_lookup": directory,
            "target_lookup_w2_vs_redis": 0.9,
            "requests": args.requests,
            "rounds": args.rounds,
        },
    )


if __name__ == "__main__":
    main()
