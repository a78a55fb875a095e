"""EVALSHA of a small script against redis-server, unpipelined, with
``redis-benchmark`` (50 connections): the script ``return redis.call('incr', KEYS[1])``
over random keys, loaded with SCRIPT LOAD on each server first.

Baseline, started in the same run: redis-server without persistence (``--save ""
--appendonly no``). pion-server runs one worker with its write-ahead log
(``--appendfsync everysec``, the default). Servers are measured in turn, round after
round; each figure is the median over the rounds (the machine is shared).

Issue 32 target: >= 0.5x redis-server unpipelined.

    python bench/scripting.py            # 3 rounds
    python bench/scripting.py --quick    # 1 round, small counts
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Process, print_table, start_pion, start_redis, write_results

SCRIPT = "return redis.call('incr', KEYS[1])"

SERVERS: dict[str, Callable[[], Process]] = {
    "redis": start_redis,
    "pion": start_pion,
}


def evalsha_rate(port: int, requests: int, clients: int, pipeline: int) -> float:
    """requests/s of EVALSHA from redis-benchmark's CSV output."""
    sha = redis.Redis(port=port).script_load(SCRIPT)
    cmd = ["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", str(clients)]
    cmd += ["-P", str(pipeline), "-r", "100000", "--csv"]
    cmd += ["EVALSHA", sha, "1", "key:__rand_int__"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    for row in csv.reader(io.StringIO(proc.stdout)):
        if row and row[0].startswith("EVALSHA"):
            return float(row[1])
    raise RuntimeError(f"unexpected redis-benchmark output: {proc.stdout[:400]}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="1 round, small counts")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    requests = 10_000 if args.quick else 60_000
    cases = [("EVALSHA P1", 1), ("EVALSHA P16", 16)]
    samples: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        for name, start in SERVERS.items():
            server = start()
            try:
                for case, pipeline in cases:
                    rate = evalsha_rate(server.port, requests, 50, pipeline)
                    samples.setdefault((case, name), []).append(rate)
            finally:
                server.stop()
        print(f"round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for case, _ in cases:
        med = {name: statistics.median(samples[(case, name)]) for name in SERVERS}
        rows.append([case, "req/s", med["redis"], med["pion"], med["pion"] / med["redis"]])
        results.append({"case": case, "unit": "req/s", "median": med})
    print_table(["case", "unit", "redis", "pion", "x redis"], rows)
    path = write_results("scripting", {"rounds": rounds, "quick": args.quick, "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
