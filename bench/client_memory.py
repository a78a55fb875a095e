"""Client memory benchmarks (issue 10): what a careless or hostile client makes the
server hold, as the server process's own resident set size, against redis-server doing
the same in the same run.

1. A client that pipelines --depth 8 MiB reads and never reads a reply: pion-server
   ``V.FETCH`` of a 256 x 8192 session (fp32 reply), redis-server ``GET`` of an 8 MiB
   string. Peak RSS growth over 3 s. (Redis's default client-output-buffer-limit for
   normal clients is unlimited, so it holds the whole pipeline.)
2. The same pipeline from a client that reads every reply (redis-py): peak RSS growth
   and wall time.
3. Three unauthenticated connections that each announce a 512 MiB AUTH password and
   send --push MiB of it, on servers with a password. Peak RSS growth.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import redis

from _common import Process, print_table, start_pion, start_redis, write_results

MiB = 1024 * 1024
ROWS, DIM = 256, 8192
PASSWORD = "bench-pass"


def _encode(*parts: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Target:
    """One server under test and how to read 8 MiB from it."""

    def __init__(self, name: str, proc: Process, read: tuple[str | int, ...]) -> None:
        self.name = name
        self.proc = proc
        self.read = read

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.proc.port, password=PASSWORD, socket_timeout=120)


def _targets() -> list[Target]:
    pion = Target(
        "pion-server",
        start_pion("--no-wal", "--requirepass", PASSWORD),
        ("V.FETCH", "big", 0, "RANGE", 0, ROWS),
    )
    values = (np.arange(ROWS * DIM, dtype=np.float32) % 1024).reshape(ROWS, DIM)
    with pion.client() as r:
        r.execute_command("V.CREATE", "big", DIM, "VQUANT", "fp16")
        r.execute_command("V.STOREBATCH", "big", 0, 0, ROWS, values.tobytes())
    baseline = Target("redis-server", start_redis(), ("GET", "big"))
    with redis.Redis(port=baseline.proc.port) as b:
        b.config_set("requirepass", PASSWORD)
    with baseline.client() as b:
        b.set("big", values.tobytes())
    return [pion, baseline]


def _peak_growth(proc: Process, seconds: float, during: Callable[[], object] | None) -> float:
    """Peak RSS growth (MiB) while ``during`` runs (or for ``seconds``)."""
    base = proc.rss()
    peak = base
    done = threading.Event()
    result: list[object] = []

    def work() -> None:
        try:
            if during is not None:
                result.append(during())
        finally:
            done.set()

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + seconds
    while not (done.is_set() and time.monotonic() >= deadline):
        peak = max(peak, proc.rss())
        time.sleep(0.02)
    worker.join()
    return (peak - base) / MiB


def non_reader(t: Target, depth: int) -> float:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", t.proc.port))
    s.sendall(_encode("AUTH", PASSWORD) + _encode(*t.read) * depth)
    try:
        return _peak_growth(t.proc, 3.0, None)
    finally:
        s.close()
        time.sleep(1.0)  # let the server drop what it held


def reader(t: Target, depth: int) -> tuple[float, float]:
    with t.client() as r:
        pipe = r.pipeline(transaction=False)
        for _ in range(depth):
            pipe.execute_command(*t.read)
        t0 = time.perf_counter()
        growth = _peak_growth(t.proc, 0.0, pipe.execute)
        return growth, time.perf_counter() - t0


def unauthenticated(t: Target, push_mib: int) -> float:
    def push() -> None:
        socks = [socket.create_connection(("127.0.0.1", t.proc.port)) for _ in range(3)]

        def one(s: socket.socket) -> None:
            with contextlib.suppress(OSError):  # refused and closed: the point
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$536870912\r\n")
                block = b"x" * MiB
                for _ in range(push_mib):
                    s.sendall(block)

        threads = [threading.Thread(target=one, args=(s,)) for s in socks]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        time.sleep(0.5)
        for s in socks:
            s.close()

    return _peak_growth(t.proc, 0.0, push)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--depth", type=int, default=200, help="pipelined 8 MiB reads")
    ap.add_argument("--push", type=int, default=200, help="MiB each AUTH client sends")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.depth, args.push = 40, 32
    targets = _targets()
    out: dict[str, dict[str, float]] = {}
    try:
        for t in targets:
            grown, took = reader(t, args.depth)
            out[t.name] = {
                "non_reader_peak_mib": non_reader(t, args.depth),
                "reader_peak_mib": grown,
                "reader_seconds": took,
                "unauth_peak_mib": unauthenticated(t, args.push),
            }
    finally:
        for t in targets:
            t.proc.stop()
    pion, base = out["pion-server"], out["redis-server"]
    rows = [
        [f"non-reading client, {args.depth} x 8 MiB: peak MiB", "non_reader_peak_mib"],
        [f"reading client, {args.depth} x 8 MiB: peak MiB", "reader_peak_mib"],
        [f"reading client, {args.depth} x 8 MiB: seconds", "reader_seconds"],
        [f"3 unauthenticated 512 MiB AUTH, {args.push} MiB sent each: peak MiB", "unauth_peak_mib"],
    ]
    print_table(
        ["benchmark", "pion", "redis-server", "ratio"],
        [
            [label, pion[key], base[key], pion[key] / base[key] if base[key] > 0 else float("nan")]
            for label, key in rows
        ],
    )
    write_results("client_memory", {"depth": args.depth, "push_mib": args.push, **out})


if __name__ == "__main__":
    main()
