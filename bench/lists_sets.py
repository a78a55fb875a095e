"""Lists and sets against redis-server: LPUSH, RPOP, SADD and SISMEMBER of small
elements with ``redis-benchmark``, unpipelined (50 clients) and ``-P 16``.

Baselines, started in the same run on this machine: redis-server without persistence
(``--save "" --appendonly no``). pion-server runs with its write-ahead log
(``--appendfsync everysec``, the default) and with ``--no-wal``. Servers are measured
in turn, round after round; each figure is the median over the rounds.

Issue 32's target: each >= 0.5x redis-server unpipelined.

    python bench/lists_sets.py            # 3 rounds
    python bench/lists_sets.py --quick    # 1 round, small counts
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Process, print_table, start_pion, start_redis, write_results

SERVERS: dict[str, Callable[[], Process]] = {
    "redis": start_redis,
    "pion": start_pion,
    "pion-nowal": lambda: start_pion("--no-wal"),
}

# (label, redis-benchmark arguments): its own tests, and SISMEMBER as a custom command
# against the set its SADD test filled (members element:<0..99999>, half of them hit).
TESTS: list[tuple[str, list[str]]] = [
    ("LPUSH", ["-t", "lpush"]),
    ("RPOP", ["-t", "rpop"]),
    ("SADD", ["-t", "sadd", "-r", "100000"]),
    ("SISMEMBER", ["-r", "200000", "SISMEMBER", "myset", "element:__rand_int__"]),
]


def rate(port: int, extra: list[str], requests: int, pipeline: int) -> float:
    """requests/s of one redis-benchmark run (its CSV's one row)."""
    cmd = ["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", "50"]
    cmd += ["-P", str(pipeline), "--csv", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    rows = [r for r in csv.reader(io.StringIO(proc.stdout)) if r and r[0] != "test"]
    if len(rows) != 1:
        raise RuntimeError(f"unexpected redis-benchmark output: {proc.stdout[:400]}")
    return float(rows[0][1])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="1 round, small counts")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    requests = 10_000 if args.quick else 100_000
    samples: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        for name, start in SERVERS.items():
            server = start()
            try:
                for pipeline in (1, 16):
                    for label, extra in TESTS:
                        # Pipelined runs take 4x the requests (not 16x: the whole
                        # run stays within minutes at pion's rate).
                        got = rate(server.port, extra, requests * min(pipeline, 4), pipeline)
                        samples.setdefault((f"{label} P{pipeline}", name), []).append(got)
            finally:
                server.stop()
        print(f"round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for case in dict.fromkeys(c for c, _ in samples):
        med = {name: statistics.median(samples[(case, name)]) for name in SERVERS}
        rows.append(
            [case, med["redis"], med["pion"], med["pion-nowal"], med["pion"] / med["redis"]]
        )
        results.append({"case": case, "unit": "req/s", "median": med})
    print_table(["case", "redis", "pion", "pion-nowal", "x redis"], rows)
    path = write_results("lists_sets", {"rounds": rounds, "quick": args.quick, "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
