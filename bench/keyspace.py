"""The plain keyspace against redis-server: GET/SET of 256 B, 2 MB and 8 MB values with
``redis-benchmark`` (unpipelined and ``-P 16``), and LMCache-shaped 4 MB chunk
throughput over 8 connections.

Baselines, started in the same run on this machine: redis-server without persistence
(``--save "" --appendonly no``, what the issue compares with) and redis-server with an
append-only file fsynced every second (``--appendonly yes --appendfsync everysec``),
the like-for-like durability of pion-server's default. pion-server runs with its
write-ahead log (``--appendfsync everysec``, the default) and with ``--no-wal``.
Servers are measured in turn, round after round, and each figure is the median over
the rounds, because the machine is shared.

Issue 15 targets: 2 MB and larger values >= 0.9x redis-server, 256 B >= 0.5x with one
worker.

    python bench/keyspace.py            # 3 rounds, full sizes
    python bench/keyspace.py --quick    # 1 round, small counts
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Process,
    cpu_seconds,
    free_port,
    print_table,
    start_pion,
    start_redis,
    write_results,
)

MB = 1 << 20


def start_redis_aof() -> Process:
    """redis-server with an append-only file fsynced every second."""
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="redis-aof-bench-")
    cmd = [path, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    cmd += ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", workdir]
    cmd += ["--protected-mode", "no", "--loglevel", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return Process(proc, port, workdir)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{path} did not start")


SERVERS: dict[str, Callable[[], Process]] = {
    "redis": start_redis,
    "redis-aof": start_redis_aof,
    "pion": start_pion,
    "pion-nowal": lambda: start_pion("--no-wal"),
}


def redis_benchmark(
    server: Process, size: int, pipeline: int, requests: int, clients: int, *, tries: int = 3
) -> dict[str, tuple[float, float]]:
    """(requests/s, the server's CPU microseconds per request) of SET, then GET, from
    redis-benchmark's CSV output, one run each (retried: the tool itself occasionally
    aborts a run with large pipelined values)."""
    out: dict[str, tuple[float, float]] = {}
    for op in ("SET", "GET"):
        for attempt in range(tries):
            cpu0 = cpu_seconds(server)
            try:
                rate = _redis_benchmark(server.port, size, pipeline, requests, clients, op=op)
            except RuntimeError:
                if attempt == tries - 1:
                    raise
                continue
            out[op] = (rate, (cpu_seconds(server) - cpu0) * 1e6 / requests)
            break
    return out


def _redis_benchmark(
    port: int, size: int, pipeline: int, requests: int, clients: int, *, op: str
) -> float:
    cmd = ["redis-benchmark", "-p", str(port), "-t", op.lower(), "-d", str(size)]
    cmd += ["-n", str(requests), "-c", str(clients), "-P", str(pipeline), "--csv"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}{proc.stdout[-2000:]}")
    out = proc.stdout
    for row in csv.reader(io.StringIO(out)):
        if row and row[0] == op:
            return float(row[1])
    raise RuntimeError(f"unexpected redis-benchmark output: {out[:400]}")


def _resp(*args: bytes) -> list[bytes]:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out += [b"$%d\r\n" % len(a), a, b"\r\n"]
    return out


def _read_line(sock: socket.socket, buf: bytearray) -> bytes:
    while True:
        i = buf.find(b"\r\n")
        if i >= 0:
            line = bytes(buf[:i])
            del buf[: i + 2]
            return line
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("server closed the connection")
        buf += data


def lmcache_chunks(port: int, connections: int, per_connection: int, size: int) -> dict[str, float]:
    """LMCache's resp:// traffic: each connection SETs its chunks, then GETs them back;
    MB/s of chunk payload for each phase (wall time of the slowest connection)."""
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    barrier = threading.Barrier(connections + 1)
    spans: dict[str, list[float]] = {"SET": [], "GET": []}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = bytearray()
            keys = [b"model@1@%d@%032x@bfloat16" % (n, i) for i in range(per_connection)]
            barrier.wait()
            t0 = time.perf_counter()
            for key in keys:
                sock.sendall(b"".join(_resp(b"SET", key, data)))
                if _read_line(sock, buf) != b"+OK":
                    raise RuntimeError("SET did not answer +OK")
            spans["SET"].append(time.perf_counter() - t0)
            barrier.wait()
            t0 = time.perf_counter()
            for key in keys:
                sock.sendall(b"".join(_resp(b"GET", key)))
                n_bytes = int(_read_line(sock, buf)[1:])
                while len(buf) < n_bytes + 2:
                    more = sock.recv(8 << 20)
                    if not more:
                        raise ConnectionError("server closed the connection")
                    buf += more
                del buf[: n_bytes + 2]
            spans["GET"].append(time.perf_counter() - t0)
            sock.close()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(connections)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    total = connections * per_connection * size / MB
    return {op: total / max(s) for op, s in spans.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="1 round, small counts")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    scale = 10 if args.quick else 1
    # (size, pipeline, requests, clients)
    # Pipelined request counts are multiples of 16: redis-benchmark sometimes aborts
    # ("All clients disconnected") when the last batch is partial, whatever the server.
    cases = [
        (256, 1, 100_000 // scale, 50),
        (256, 16, 400_000 // scale, 50),
        (2 * MB, 1, 400 // scale, 8),
        (2 * MB, 16, 320 // scale // 16 * 16 or 16, 1),
        (8 * MB, 1, 100 // scale, 8),
        (8 * MB, 16, 96 // scale // 16 * 16 or 16, 1),
    ]
    per_conn = 4 if args.quick else 16
    samples: dict[tuple[str, str], list[float]] = {}
    # The server's CPU time (user + system) per request of each redis-benchmark case:
    # on a shared machine rates follow each process's share of the CPU, CPU time is
    # what the server spends.
    cpu: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        for name, start in SERVERS.items():
            server = start()
            try:
                for size, pipeline, requests, clients in cases:
                    rates = redis_benchmark(server, size, pipeline, requests, clients)
                    for op, (rate, us) in rates.items():
                        case = f"{op} {_size(size)} P{pipeline}"
                        samples.setdefault((case, name), []).append(rate)
                        cpu.setdefault((case, name), []).append(us)
                chunks = lmcache_chunks(server.port, 8, per_conn, 4 * MB)
                for op, rate in chunks.items():
                    samples.setdefault((f"LMCache 4MB {op} x8", name), []).append(rate)
            finally:
                server.stop()
        print(f"round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for case in dict.fromkeys(c for c, _ in samples):
        med = {name: statistics.median(samples[(case, name)]) for name in SERVERS}
        unit = "MB/s" if case.startswith("LMCache") else "req/s"
        cpu_us = (
            {name: statistics.median(cpu[(case, name)]) for name in SERVERS}
            if (case, "redis") in cpu
            else None
        )
        rows.append(
            [
                case,
                unit,
                med["redis"],
                med["redis-aof"],
                med["pion"],
                med["pion-nowal"],
                med["pion"] / med["redis"],
                med["pion"] / med["redis-aof"],
                med["pion-nowal"] / med["redis"],
                "" if cpu_us is None else cpu_us["redis"],
                "" if cpu_us is None else cpu_us["pion-nowal"],
            ]
        )
        result: dict[str, Any] = {
            "case": case,
            "unit": unit,
            "median": med,
            "samples": {name: samples[(case, name)] for name in SERVERS},
        }
        if cpu_us is not None:
            result["cpu_us_per_request"] = cpu_us
        results.append(result)
    print_table(
        [
            "case",
            "unit",
            "redis",
            "redis-aof",
            "pion",
            "pion-nowal",
            "x redis",
            "x redis-aof",
            "nowal x redis",
            "redis CPU us/req",
            "nowal CPU us/req",
        ],
        rows,
    )
    path = write_results("keyspace", {"rounds": rounds, "quick": args.quick, "results": results})
    print(f"wrote {path}")
    return 0


def _size(n: int) -> str:
    return f"{n // MB}MB" if n >= MB else f"{n}B"


if __name__ == "__main__":
    sys.exit(main())
