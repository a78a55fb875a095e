"""Persistence: recovery speed against a plain read of the same files, and V.STOREBATCH
throughput under each ``--appendfsync`` policy against ``--no-wal``.

Recovery (in-process, the library the server runs at start): a store of L layers x T
tokens x D dims of fp16 rows is written through the write-ahead log, then snapshotted.
We time (a) a plain sequential read of each file into a preallocated buffer (16 MiB
``readinto``: the baseline, what the disk and page cache can deliver), (b) loading the
snapshot into an empty store and (c) replaying the log into an empty store. Each figure
is GB/s of file bytes and the ratio to the plain read of the same file in the same run;
a second baseline, "read+alloc", reads the file into newly allocated memory, the floor
for any loader whose data must end up in fresh pages of RAM.
By default the files are warm in the page cache (so the ratio measures our CPU cost);
``--cold`` drops the page cache before every timed read (root only) to include the disk.

Throughput (real server processes): ``V.STOREBATCH ... FMT F16`` of B-byte batches,
``--pipeline`` commands in flight, under ``always`` / ``everysec`` / ``no`` and under
``--no-wal``, same client, same run; MB/s of payload and the ratio to ``--no-wal``.

    python bench/persistence.py            # 1 GiB store, 16 MiB and 256 KiB batches
    python bench/persistence.py --quick    # 128 MiB store, fewer batches (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, start_pion, write_results
from pion.config import ServerConfig
from pion.persistence import Persistence, snapshot_path, wal_path
from pion.persistence.recovery import recover_sync
from pion.vstore import VStore

GB = 1e9
MB = 1e6
_READ_CHUNK = 16 << 20


def _drop_caches(enabled: bool) -> None:
    if enabled:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _best(fn: Callable[[], object], repeat: int, cold: bool) -> float:
    times = []
    for _ in range(repeat):
        _drop_caches(cold)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def plain_read(path: Path) -> None:
    buf = np.empty(_READ_CHUNK, dtype=np.uint8)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass


def fresh_read(path: Path) -> None:
    """Read the whole file into newly allocated memory: what any loader pays at least,
    since the data must end up in fresh pages of RAM."""
    buf = np.empty(path.stat().st_size, dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        f.readinto(memoryview(buf))


def _store(config: ServerConfig) -> VStore:
    return VStore(config.vstore, max_sessions=1_000_000)


def recovery_bench(layers: int, tokens: int, dim: int, repeat: int, cold: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pion-bench-persist-"))
    try:
        config = dataclasses.replace(ServerConfig(), dir=work / "data", appendfsync="no")
        vs = _store(config)
        p = Persistence(config, vs)
        p.open()
        p.recover_now()
        rng = np.random.default_rng(0)
        block = rng.standard_normal((tokens, dim)).astype("<f2")
        for half in ("pk", "pv"):
            vs.create(f"ns_{half}".encode(), dim, "fp16")
            for layer in range(layers):
                vs.store(f"ns_{half}".encode(), layer, 0, block)
        log_copy = work / "wal.copy"
        shutil.copyfile(wal_path(work / "data", 0), log_copy)
        p.save(None)
        p.close()
        snap_dir, log_dir = work / "snap", work / "log"
        snap_dir.mkdir()
        log_dir.mkdir()
        shutil.move(snapshot_path(work / "data", 0), snapshot_path(snap_dir, 0))
        shutil.move(log_copy, wal_path(log_dir, 0))
        snap, log = snapshot_path(snap_dir, 0), wal_path(log_dir, 0)
        sizes = {"snapshot": snap.stat().st_size, "log": log.stat().st_size}

        def load(directory: Path) -> Callable[[], object]:
            def run() -> None:
                target = _store(config)
                res = recover_sync(target, snapshot_path(directory, 0), wal_path(directory, 0))
                if target.vstore_bytes != vs.vstore_bytes or res.truncated:
                    raise RuntimeError("recovery did not rebuild the store")

            return run

        out: dict[str, Any] = {
            "vstore_bytes": vs.vstore_bytes,
            **{f"{k}_bytes": v for k, v in sizes.items()},
        }
        for name, path, directory in (("snapshot", snap, snap_dir), ("log", log, log_dir)):
            read_s = _best(lambda path=path: plain_read(path), repeat, cold)
            fresh_s = _best(lambda path=path: fresh_read(path), repeat, cold)
            load_s = _best(load(directory), repeat, cold)
            out[name] = {
                "read_s": read_s,
                "fresh_read_s": fresh_s,
                "load_s": load_s,
                "read_gb_s": sizes[name] / read_s / GB,
                "fresh_read_gb_s": sizes[name] / fresh_s / GB,
                "load_gb_s": sizes[name] / load_s / GB,
                "load_over_read": read_s / load_s,
                "load_over_fresh_read": fresh_s / load_s,
            }
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def storebatch_bench(
    flags: Sequence[str], batch_bytes: int, batches: int, pipeline: int
) -> dict[str, float]:
    dim = 1024
    count = max(1, batch_bytes // (dim * 2))
    blob = np.random.default_rng(1).standard_normal((count, dim)).astype("<f2").tobytes()
    server = start_pion("--vstore-max-sessions", "100000", *flags)
    try:
        c = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=600)
        layers = 64
        for s in range(batches // layers + 1):
            c.execute_command("V.CREATE", f"s{s}", dim, "VQUANT", "fp16")

        def run(n: int) -> None:
            pipe = c.pipeline(transaction=False)
            for i in range(n):
                sid, layer = f"s{i // layers}", i % layers
                pipe.execute_command("V.STOREBATCH", sid, layer, 0, count, blob, "FMT", "F16")
                if len(pipe) >= pipeline:
                    pipe.execute()
            pipe.execute()

        run(min(batches, pipeline * 2))  # warm up: allocations, first writes
        t0 = time.perf_counter()
        run(batches)
        elapsed = time.perf_counter() - t0
        c.close()
        return {"seconds": elapsed, "mb_s": batches * len(blob) / elapsed / MB}
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=32, help="layers per half (store = 2 halves)")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3, help="timed runs per figure (best)")
    p.add_argument("--cold", action="store_true", help="drop the page cache before reads")
    p.add_argument("--big-batches", type=int, default=64, help="16 MiB batches per policy")
    p.add_argument("--small-batches", type=int, default=2000, help="256 KiB batches")
    p.add_argument("--pipeline", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="128 MiB store, fewer batches")
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.tokens, args.repeat = 8, 4096, 2
        args.big_batches, args.small_batches = 16, 400

    rec = recovery_bench(args.layers, args.tokens, args.dim, args.repeat, args.cold)
    print(
        f"Recovery of a {rec['vstore_bytes'] / GB:.2f} GB store (fp16, {2 * args.layers} "
        f"layers x {args.tokens} tokens x {args.dim}), best of {args.repeat}, "
        f"page cache {'dropped' if args.cold else 'warm'}"
    )
    print_table(
        ["file", "GB", "read GB/s", "read+alloc GB/s", "load GB/s", "/ read", "/ read+alloc"],
        [
            [
                name,
                rec[f"{name}_bytes"] / GB,
                r["read_gb_s"],
                r["fresh_read_gb_s"],
                r["load_gb_s"],
                r["load_over_read"],
                r["load_over_fresh_read"],
            ]
            for name, r in (("snapshot", rec["snapshot"]), ("log", rec["log"]))
        ],
    )

    policies = [("--no-wal", ["--no-wal"])] + [
        (pol, ["--appendfsync", pol]) for pol in ("always", "everysec", "no")
    ]
    sizes = [("16 MiB", 16 << 20, args.big_batches), ("256 KiB", 256 << 10, args.small_batches)]
    throughput: list[dict[str, Any]] = []
    for label, nbytes, n in sizes:
        base = None
        for name, flags in policies:
            res = storebatch_bench(flags, nbytes, n, args.pipeline)
            base = base or res["mb_s"]
            throughput.append(
                {"batch": label, "policy": name, **res, "over_no_wal": res["mb_s"] / base}
            )
    print(
        f"\nV.STOREBATCH FMT F16 throughput, {args.pipeline} in flight, one client "
        "(ratio to --no-wal in the same run)"
    )
    print_table(
        ["batch", "policy", "MB/s", "x --no-wal"],
        [[t["batch"], t["policy"], t["mb_s"], t["over_no_wal"]] for t in throughput],
    )
    path = write_results(
        "persistence",
        {"config": vars(args), "recovery": rec, "storebatch": throughput},
    )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
