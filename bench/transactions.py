"""Transactions against redis-server: MULTI/EXEC of 4 SETs, and redis-py's default
(transactional) pipeline of 100 commands, in requests per second.

Cases, each on every server in turn, round after round (the figure is the median
over the rounds, because the machine is shared):

- ``MULTI+4 SET+EXEC``: raw RESP over 4 connections, 64 transactions sent per round
  trip; a request is one transaction (6 commands). The client only sends pre-encoded
  bytes and counts reply bytes, so the servers are what is measured.
- ``MULTI+4 SET+EXEC P1``: the same, one transaction per round trip (latency-bound).
- ``redis-py pipeline(100)``: ``r.pipeline()`` with 100 SETs, ``execute()`` (MULTI,
  100 SET, EXEC) from 4 threads; a request is one command of the 100. redis-py's own
  Python work is part of it, as it is for a user.
- ``6 SET P64 (reference)``: the P64 case without the transaction, six plain SETs in
  its place (the same number of commands and round trips); a request is the six. It
  shows what a transaction costs beyond its commands (it has no target).

Beside each rate, the server's CPU time per request (user + system, read from
``/proc`` before and after): on a shared machine the rates follow the share of the
CPU each process gets, while the CPU time per request is what the server spends.
redis-server at P64 is bound by this Python client (it idles much of the run); pion
is bound by its own CPU time per command.

Baselines, started in the same run: redis-server without persistence (``--save ""
--appendonly no``) and with an append-only file fsynced every second (the like-for-like
durability of pion-server's default). pion-server runs one worker with its write-ahead
log (``--appendfsync everysec``, the default), where an EXEC is one log record.

Issue 23 target: >= 0.5x redis-server (single worker).

    python bench/transactions.py            # 3 rounds
    python bench/transactions.py --quick    # 1 round, short runs
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Process, cpu_seconds, print_table, start_pion, start_redis, write_results
from keyspace import start_redis_aof

SERVERS: dict[str, Callable[[], Process]] = {
    "redis": start_redis,
    "redis-aof": start_redis_aof,
    "pion": start_pion,
    # Issue 31 measures the server's own cost per command: one worker without the log.
    "pion-nowal": lambda: start_pion("--no-wal"),
}
CONNECTIONS = 4


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _transaction(i: int) -> bytes:
    sets = b"".join(_resp(b"SET", b"tx:%d:%d" % (i, k), b"v" * 16) for k in range(4))
    return _resp(b"MULTI") + sets + _resp(b"EXEC")


# What both servers answer to one transaction, byte for byte.
_TX_REPLY = b"+OK\r\n" + b"+QUEUED\r\n" * 4 + b"*4\r\n" + b"+OK\r\n" * 4


def _plain_sets(i: int) -> bytes:
    return b"".join(_resp(b"SET", b"tx:%d:%d" % (i, k), b"v" * 16) for k in range(6))


_SETS_REPLY = b"+OK\r\n" * 6


def raw_transactions(port: int, per_trip: int, seconds: float, *, plain: bool = False) -> float:
    """Transactions per second over CONNECTIONS connections, ``per_trip`` at a time
    (``plain``: six plain SETs in place of each transaction)."""
    import socket

    counts = [0] * CONNECTIONS
    stop = time.monotonic() + seconds
    request, reply = (_plain_sets, _SETS_REPLY) if plain else (_transaction, _TX_REPLY)

    def worker(n: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        batch = b"".join(request(n * 1000 + j) for j in range(per_trip))
        want = len(reply) * per_trip
        first = True
        while time.monotonic() < stop:
            sock.sendall(batch)
            got = bytearray()
            while len(got) < want:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("server closed the connection")
                got += chunk
            if first:  # checked once: the replies are what a transaction answers
                assert bytes(got) == reply * per_trip, bytes(got[:200])
                first = False
            counts[n] += per_trip
        sock.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


def redis_py_pipelines(port: int, size: int, seconds: float) -> float:
    """Commands per second of redis-py's default pipeline of ``size`` SETs."""
    counts = [0] * CONNECTIONS
    stop = time.monotonic() + seconds

    def worker(n: int) -> None:
        r = redis.Redis(port=port)
        keys = [f"py:{n}:{k}" for k in range(size)]
        while time.monotonic() < stop:
            pipe = r.pipeline()  # transactional: MULTI .. EXEC
            for key in keys:
                pipe.set(key, "v" * 16)
            replies = pipe.execute()
            assert len(replies) == size and all(replies)
            counts[n] += size
        r.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


CASES: dict[str, Callable[[int, float], float]] = {
    "MULTI+4 SET+EXEC P64": lambda port, s: raw_transactions(port, 64, s),
    "MULTI+4 SET+EXEC P1": lambda port, s: raw_transactions(port, 1, s),
    "redis-py pipeline(100)": lambda port, s: redis_py_pipelines(port, 100, s),
    "6 SET P64 (reference)": lambda port, s: raw_transactions(port, 64, s, plain=True),
}
UNITS = {
    "MULTI+4 SET+EXEC P64": "tx/s",
    "MULTI+4 SET+EXEC P1": "tx/s",
    "redis-py pipeline(100)": "cmd/s",
    "6 SET P64 (reference)": "6 SET/s",
}
# Cases measured for comparison only: no target.
REFERENCE = frozenset({"6 SET P64 (reference)"})


def measured(
    server: Process, run: Callable[[int, float], float], seconds: float
) -> tuple[float, float]:
    """(requests per second, the server's CPU microseconds per request)."""
    cpu0, t0 = cpu_seconds(server), time.monotonic()
    rate = run(server.port, seconds)
    cpu, elapsed = cpu_seconds(server) - cpu0, time.monotonic() - t0
    return rate, cpu * 1e6 / max(rate * elapsed, 1.0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="one short round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="per case and server")
    args = ap.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    seconds = 0.5 if args.quick else args.seconds
    samples: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds):
        for name, start in SERVERS.items():
            server = start()
            try:
                for case, run in CASES.items():
                    rate, us = measured(server, run, seconds)
                    samples.setdefault((case, name), []).append(rate)
                    cpu.setdefault((case, name), []).append(us)
            finally:
                server.stop()
        print(f"round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for case in CASES:
        med = {name: statistics.median(samples[(case, name)]) for name in SERVERS}
        cpu_us = {name: statistics.median(cpu[(case, name)]) for name in SERVERS}
        rows.append(
            [
                case,
                UNITS[case],
                med["redis"],
                med["redis-aof"],
                med["pion"],
                med["pion"] / med["redis"],
                med["pion"] / med["redis-aof"],
                med["pion-nowal"],
                med["pion-nowal"] / med["redis"],
                cpu_us["redis"],
                cpu_us["pion"],
                cpu_us["pion-nowal"],
            ]
        )
        results.append(
            {
                "case": case,
                "unit": UNITS[case],
                "reference": case in REFERENCE,
                "median": med,
                "samples": {name: samples[(case, name)] for name in SERVERS},
                "cpu_us_per_request": cpu_us,
            }
        )
    headers = ["case", "unit", "redis", "redis-aof", "pion", "x redis", "x redis-aof"]
    headers += ["pion-nowal", "nowal x redis"]
    print_table([*headers, "redis CPU us/req", "pion CPU us/req", "nowal CPU us/req"], rows)
    path = write_results(
        "transactions",
        {
            "rounds": rounds,
            "seconds": seconds,
            "connections": CONNECTIONS,
            "target": 0.5,
            "results": results,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
