"""Streams against redis-server: XADD (``*`` ids, one field of 16 B) with
``redis-benchmark``, 50 clients unpipelined, and a consumer's XREADGROUP ``>`` COUNT 1
then XACK of what it got, one client, each command its own round trip (what a job
worker does per job), in pairs per second.

Baselines, started in the same run on this machine: redis-server without persistence
(``--save "" --appendonly no``). pion-server runs with its write-ahead log
(``--appendfsync everysec``, the default): each XADD, each delivery and each XACK is
a log record. Servers are measured in turn, round after round; each figure is the
median over the rounds.

Target: >= 0.5x redis-server unpipelined.

    python bench/streams.py            # 3 rounds
    python bench/streams.py --quick    # 1 round, small counts
"""

from __future__ import annotations

import argparse
import csv
import io
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Process, print_table, start_pion, start_redis, write_results

SERVERS: dict[str, Callable[[], Process]] = {"redis": start_redis, "pion": start_pion}
TARGET = 0.5


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def xadd_rate(port: int, requests: int) -> float:
    """XADD requests/s of one redis-benchmark run (50 clients, unpipelined)."""
    cmd = ["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", "50", "--csv"]
    cmd += ["XADD", "bench:stream", "*", "field", "v" * 16]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    rows = [r for r in csv.reader(io.StringIO(proc.stdout)) if r and r[0] != "test"]
    if len(rows) != 1:
        raise RuntimeError(f"unexpected redis-benchmark output: {proc.stdout[:400]}")
    return float(rows[0][1])


class _Conn:
    """One raw connection: a command out, its whole reply back (the caller says how
    the reply ends)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, command: bytes, ends: Callable[[bytes], bool]) -> bytes:
        self.sock.sendall(command)
        got = b""
        while not ends(got):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("the server closed the connection")
            got += chunk
        return got

    def close(self) -> None:
        self.sock.close()


def _line(reply: bytes) -> bool:
    return reply.endswith(b"\r\n")


def consume_rate(port: int, jobs: int) -> float:
    """XREADGROUP ``>`` COUNT 1 + XACK pairs/s over a stream of ``jobs`` entries."""
    c = _Conn(port)
    try:
        c.call(_command(b"DEL", b"bench:jobs"), _line)
        fill = b"".join(
            _command(b"XADD", b"bench:jobs", b"*", b"job", b"%d" % i) for i in range(jobs)
        )
        c.call(fill, lambda r: r.count(b"\r\n") >= 2 * jobs)
        create = _command(b"XGROUP", b"CREATE", b"bench:jobs", b"workers", b"0")
        if c.call(create, _line) != b"+OK\r\n":
            raise RuntimeError("XGROUP CREATE failed")
        read = _command(
            b"XREADGROUP",
            b"GROUP",
            b"workers",
            b"w1",
            b"COUNT",
            b"1",
            b"STREAMS",
            b"bench:jobs",
            b">",
        )
        start = time.perf_counter()
        for _ in range(jobs):
            # [[key, [[id, [field, value]]]]]: 13 lines, the id the 8th.
            reply = c.call(read, lambda r: r.count(b"\r\n") >= 13)
            entry_id = reply.split(b"\r\n")[7]
            acked = c.call(_command(b"XACK", b"bench:jobs", b"workers", entry_id), _line)
            if acked != b":1\r\n":
                raise RuntimeError(f"XACK answered {acked!r}")
        return jobs / (time.perf_counter() - start)
    finally:
        c.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="1 round, small counts")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    requests, jobs = (5_000, 1_000) if args.quick else (100_000, 20_000)
    samples: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        for name, start in SERVERS.items():
            server = start()
            try:
                samples.setdefault(("XADD", name), []).append(xadd_rate(server.port, requests))
                got = consume_rate(server.port, jobs)
                samples.setdefault(("XREADGROUP + XACK", name), []).append(got)
            finally:
                server.stop()
        print(f"round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for case, unit in (("XADD", "req/s"), ("XREADGROUP + XACK", "pairs/s")):
        med = {name: statistics.median(samples[(case, name)]) for name in SERVERS}
        rows.append([case, unit, med["redis"], med["pion"], med["pion"] / med["redis"]])
        results.append({"case": case, "unit": unit, "median": med})
    print_table(["case", "unit", "redis", "pion", "x redis"], rows)
    payload = {"rounds": rounds, "quick": args.quick, "target": TARGET, "results": results}
    path = write_results("streams", payload)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
