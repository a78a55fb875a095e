"""Run every benchmark in turn (``make bench``); each prints its table and writes
``bench/results/<name>.json``. ``--quick`` passes ``--quick`` to each (smoke sizes);
``--only NAME`` runs one.

Every figure is a ratio against a baseline measured in the same run on this machine
(redis-server on the same bytes, cold prefill on the same llama-server, a plain read of
the same files): see each script's docstring.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    "decoder",
    "vstore_throughput",
    "vstore_eviction",
    "registry",
    "workers",
    "persistence",
    "tier",
    "fidelity",
    "real_model",
    "llama_prefix",
    "llama_store",
    "agents",
    "llama_sessions",
    "fleet",
    "llama_status",
    "client_memory",
    "attend",
    "keyspace",
    "lists_sets",
    "streams",
    "export_fetch",
    "transactions",
    "fairness",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke-run sizes")
    ap.add_argument("--only", choices=BENCHES, action="append", help="run only these")
    args = ap.parse_args()
    failed = []
    for name in args.only or BENCHES:
        script = HERE / f"{name}.py"
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        cmd = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
        rc = subprocess.call(cmd, cwd=HERE)
        print(f"--- {name}: exit {rc} in {time.monotonic() - t0:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
