"""V-store eviction cost (issue 10, item 7): a V.CREATE at the session limit, and
lowering the limit far below the number of sessions.

In-process, on the library the server runs (``pion.vstore.VStore``), with a journal
that discards records (the WAL's cost is measured by ``persistence.py``):

1. ``create at the limit``: N sessions (namespace halves ``<ns>_pk``/``<ns>_pv``, one
   row each) with ``--vstore-max-sessions`` N; each further create evicts the least
   recently used namespace. Median over ``--creates`` creates, for N = 2,000 and
   20,000. Same-run baseline: a create below the limit in the same store (no eviction).
   O(1) eviction means the ratio stays small and does not grow with N.
2. ``limit lowered to 1``: N = 4,000 lone sessions, the limit set to 1, one create
   evicts all of them. Same-run baseline: dropping the same 4,000 sessions one by one
   (the least work per victim any eviction can do); the ratio should be about 1.

``--baseline-src DIR`` runs the same measurements a second time with ``PYTHONPATH=DIR``
(e.g. a checkout of an older ``src``) and reports both, with the ratio old/new.

    python bench/vstore_eviction.py
    python bench/vstore_eviction.py --baseline-src /path/to/old/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_results

SRC = Path(__file__).resolve().parent.parent / "src"


class _Discard:
    def append(self, mutation: object) -> None:
        pass


def _store(n: int, limit: int, halves: bool) -> Any:
    import numpy as np

    from pion.config import VStoreLimits
    from pion.vstore import VStore

    vs = VStore(VStoreLimits(), max_sessions=limit)
    vs.journal = _Discard()
    row = np.ones((1, 8), dtype=np.float32)
    for i in range(n):
        sid = b"ns%d_p%s" % (i // 2, b"kv"[i % 2 : i % 2 + 1]) if halves else b"s%d" % i
        vs.create(sid, 8, "fp16")
        vs.store(sid, 0, 0, row)
    return vs


def _median_create_us(vs: Any, keys: list[bytes]) -> float:
    times = []
    for key in keys:
        t0 = time.perf_counter()
        vs.create(key, 8, "fp16")
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def measure(creates: int) -> dict[str, Any]:
    out: dict[str, Any] = {"at_limit": {}, "lowered": {}}
    for n in (2000, 20_000):
        vs = _store(n, n, halves=True)
        at = _median_create_us(vs, [b"a%d" % i for i in range(creates)])
        vs.set_limits(max_sessions=n + 2 * creates)
        below = _median_create_us(vs, [b"b%d" % i for i in range(creates)])
        out["at_limit"][str(n)] = {"create_us": at, "below_limit_us": below, "ratio": at / below}
    n = 4000
    vs = _store(n, n, halves=False)
    vs.set_limits(max_sessions=1)
    t0 = time.perf_counter()
    vs.create(b"new", 8, "fp16")
    lowered = time.perf_counter() - t0
    assert len(vs) == 1
    vs = _store(n, n, halves=False)
    t0 = time.perf_counter()
    for i in range(n):
        vs.drop(b"s%d" % i)
    drops = time.perf_counter() - t0
    out["lowered"] = {
        "sessions": n,
        "evict_all_s": lowered,
        "drop_all_s": drops,
        "per_victim_us": lowered / n * 1e6,
        "ratio": lowered / drops,
    }
    return out


def _run(src: Path, creates: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, __file__, "--worker", "--creates", str(creates)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--creates", type=int, default=200, help="creates timed per size")
    ap.add_argument("--baseline-src", type=Path, help="an older src/ to compare against")
    ap.add_argument("--quick", action="store_true", help="fewer creates (CI)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    creates = 20 if args.quick else args.creates
    if args.worker:
        print(json.dumps(measure(creates)))
        return 0
    runs = {"this": _run(SRC, creates)}
    if args.baseline_src is not None:
        runs["baseline"] = _run(args.baseline_src.resolve(), creates)
    rows = []
    for name, res in runs.items():
        for n, at in res["at_limit"].items():
            rows.append(
                [
                    name,
                    f"create at the limit, {n} sessions",
                    at["create_us"],
                    at["below_limit_us"],
                    at["ratio"],
                ]
            )
        low = res["lowered"]
        ms = [low["evict_all_s"] * 1e3, low["drop_all_s"] * 1e3, low["ratio"]]
        rows.append([name, "limit 4000 -> 1 (ms; baseline: 4000 drops)", *ms])
    print_table(["code", "operation", "time (us, ms)", "same-run baseline", "ratio"], rows)
    payload: dict[str, Any] = {"config": {"creates": creates}, **runs}
    if "baseline" in runs:
        old, new = runs["baseline"], runs["this"]
        payload["speedup"] = {
            **{
                f"create_at_limit_{n}": old["at_limit"][n]["create_us"]
                / new["at_limit"][n]["create_us"]
                for n in new["at_limit"]
            },
            "limit_lowered": old["lowered"]["evict_all_s"] / new["lowered"]["evict_all_s"],
        }
        print("speedup (baseline / this):", json.dumps(payload["speedup"]))
    print(f"wrote {write_results('vstore_eviction', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
