"""Fairness under hostile load (issue 21): how long a second client's PING waits while
another client floods or runs a long command, pion-server beside redis-server in the
same run, and the server's memory under floods against ``--maxmemory-clients``.

A probe client sends a PING every 2 ms (one at a time, on its own connection) while:

(a) a client sends inline PINGs in 1 MB writes as fast as it can, reading its replies;
(b) redis-py pipelines --sets SETs (300,000) in one go;
(c) one ZADD of --zadd (score, member) pairs (100,000);
(d) KEYS * runs over --keys keys (300,000; loaded before, not measured);
(e) BITPOS (a set bit in the last byte), BITCOUNT and BITOP NOT over one string of
    --bits MB (512; loaded before, not measured).

For each: the probe's p50, p99 and worst round trip (ms), and the load's own duration.
Target: p99 at most 5x redis-server's in the same test and never over 50 ms.

Memory: pion-server with ``--maxmemory-clients`` --bound MiB; four clients pipeline
GETs of a 1 KiB value and never read, for --hold seconds; the figure is the peak RSS
growth over the bound (target: at most 1.5). ``--quick``: smoke sizes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from _common import Process, print_table, start_pion, start_redis, write_results

MiB = 1024 * 1024
_PING = b"*1\r\n$4\r\nPING\r\n"
_PONG = b"+PONG\r\n"


def _probe(port: int, gap: float, stop: Any, out: Any) -> None:
    """The probe's loop, in its own process (the loads run redis-py in this one, and
    the GIL would otherwise be measured instead of the server)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts: list[float] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        sock.sendall(_PING)
        got = b""
        while len(got) < len(_PONG):
            chunk = sock.recv(64)
            if not chunk:
                break
            got += chunk
        rtts.append(time.perf_counter() - t0)
        time.sleep(gap)
    sock.close()
    out.send(rtts)


class Probe:
    """PINGs one at a time every ``gap`` seconds from another process, recording each
    round trip."""

    def __init__(self, port: int, gap: float = 0.002) -> None:
        self._stop = multiprocessing.Event()
        self._recv, send = multiprocessing.Pipe(duplex=False)
        self._proc = multiprocessing.Process(
            target=_probe, args=(port, gap, self._stop, send), daemon=True
        )
        self.rtts: list[float] = []

    def __enter__(self) -> Probe:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.rtts = self._recv.recv()
        self._proc.join(timeout=60)


def _stats(rtts: list[float], seconds: float) -> dict[str, float]:
    if not rtts:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0, "samples": 0, "seconds": seconds}
    ordered = sorted(rtts)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": p99 * 1000,
        "max_ms": ordered[-1] * 1000,
        "samples": len(ordered),
        "seconds": seconds,
    }


def _during(port: int, load: Callable[[], None]) -> dict[str, float]:
    with Probe(port) as probe:
        time.sleep(0.3)  # the probe process is up and probing
        t0 = time.perf_counter()
        load()
        seconds = time.perf_counter() - t0
    return _stats(probe.rtts, seconds)


def _ping_flood(port: int, seconds: float) -> Callable[[], None]:
    def run() -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        stop = threading.Event()

        def read() -> None:
            try:
                while sock.recv(1 << 20):
                    pass
            except OSError:
                pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        chunk = b"PING\r\n" * ((1 << 20) // 6)
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            sock.sendall(chunk)
        sock.close()
        reader.join(timeout=30)

    return run


def _set_pipeline(r: redis.Redis, n: int) -> Callable[[], None]:
    def run() -> None:
        pipe = r.pipeline(transaction=False)
        for i in range(n):
            pipe.set(f"s{i}", "v")
        pipe.execute()

    return run


def _zadd(r: redis.Redis, n: int) -> Callable[[], None]:
    mapping = {f"m{i}": float(i % 9973) for i in range(n)}

    def run() -> None:
        r.delete("z")
        r.zadd("z", mapping)

    return run


def _keys(r: redis.Redis, n: int) -> Callable[[], None]:
    pipe = r.pipeline(transaction=False)
    for start in range(0, n, 10_000):
        pipe.mset({f"k{i}": "v" for i in range(start, min(n, start + 10_000))})
    pipe.execute()

    def run() -> None:
        assert len(r.keys("*")) >= n

    return run


def _bits(r: redis.Redis, mb: int) -> dict[str, Callable[[], None]]:
    """BITPOS, BITCOUNT and BITOP NOT over a string of ``mb`` MB whose only set bit
    is its last: each reads the whole string."""
    size = mb * MiB
    r.set("bits", bytes(size - 1) + b"\x01")

    def bitpos() -> None:
        assert r.bitpos("bits", 1) == size * 8 - 1

    def bitcount() -> None:
        assert r.bitcount("bits") == 1

    def bitop_not() -> None:
        assert r.bitop("NOT", "notbits", "bits") == size

    return {"bitpos": bitpos, "bitcount": bitcount, "bitop_not": bitop_not}


def latencies(proc: Process, args: argparse.Namespace) -> dict[str, Any]:
    r = redis.Redis(port=proc.port, socket_timeout=300)
    out = {"ping_flood": _during(proc.port, _ping_flood(proc.port, args.flood_seconds))}
    out["set_pipeline"] = _during(proc.port, _set_pipeline(r, args.sets))
    out["zadd"] = _during(proc.port, _zadd(r, args.zadd))
    r.flushall()
    out["keys"] = _during(proc.port, _keys(r, args.keys))
    r.flushall()
    for name, run in _bits(r, args.bits).items():
        out[name] = _during(proc.port, run)
    r.flushall()
    r.close()
    return out


def _hog(port: int, stop: threading.Event) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.settimeout(1)
    s.connect(("127.0.0.1", port))
    batch = b"*2\r\n$3\r\nGET\r\n$1\r\nv\r\n" * 20_000
    try:
        while not stop.is_set():
            s.sendall(batch)
    except OSError:
        pass
    finally:
        s.close()


def memory(bound_mib: int, hold: float) -> dict[str, Any]:
    proc = start_pion("--no-wal", "--maxmemory-clients", f"{bound_mib}mb")
    try:
        r = redis.Redis(port=proc.port, socket_timeout=60)
        r.set("v", b"x" * 1024)
        base = proc.rss()
        stop = threading.Event()
        hogs = [threading.Thread(target=_hog, args=(proc.port, stop)) for _ in range(4)]
        for t in hogs:
            t.start()
        peak = base
        end = time.monotonic() + hold
        while time.monotonic() < end:
            peak = max(peak, proc.rss())
            time.sleep(0.01)
        stop.set()
        for t in hogs:
            t.join(timeout=30)
        evicted = int(r.info("stats")["evicted_clients"])
        growth = (peak - base) / MiB
        return {
            "bound_mib": bound_mib,
            "peak_growth_mib": growth,
            "growth_over_bound": growth / bound_mib,
            "evicted_clients": evicted,
        }
    finally:
        proc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sets", type=int, default=300_000)
    ap.add_argument("--zadd", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=300_000)
    ap.add_argument("--bits", type=int, default=512, help="the bit string's MB")
    ap.add_argument("--flood-seconds", type=float, default=5.0)
    ap.add_argument("--bound", type=int, default=64, help="--maxmemory-clients, MiB")
    ap.add_argument("--hold", type=float, default=5.0)
    args = ap.parse_args()
    if args.quick:
        args.sets, args.zadd, args.keys, args.bits = 20_000, 10_000, 20_000, 16
        args.flood_seconds, args.hold, args.bound = 1.0, 2.0, 16
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for name, start in (
        ("pion-server", lambda: start_pion("--no-wal")),
        ("redis-server", start_redis),
    ):
        proc = start()
        try:
            results[name] = latencies(proc, args)
        finally:
            proc.stop()
    rss = memory(args.bound, args.hold)
    pion, red = results["pion-server"], results["redis-server"]
    rows = []
    for load in ("ping_flood", "set_pipeline", "zadd", "keys", "bitpos", "bitcount", "bitop_not"):
        p, q = pion[load], red[load]
        ratio = p["p99_ms"] / q["p99_ms"] if q["p99_ms"] else 0.0
        pion[load]["p99_over_redis"] = ratio
        rows.append([load, p["p50_ms"], p["p99_ms"], p["max_ms"], q["p50_ms"], q["p99_ms"], ratio])
    print_table(
        [
            "load",
            "pion p50 ms",
            "pion p99 ms",
            "pion max ms",
            "redis p50 ms",
            "redis p99 ms",
            "p99 x",
        ],
        rows,
    )
    print(
        f"RSS growth {rss['peak_growth_mib']:.1f} MiB under --maxmemory-clients "
        f"{rss['bound_mib']} MiB ({rss['growth_over_bound']:.2f}x), "
        f"{rss['evicted_clients']} clients evicted"
    )
    print(f"load average before: {load_before}, after: {os.getloadavg()}")
    write_results(
        "fairness",
        {
            **results,
            "rss": rss,
            "config": {
                "sets": args.sets,
                "zadd": args.zadd,
                "keys": args.keys,
                "bits_mb": args.bits,
                "flood_seconds": args.flood_seconds,
                "quick": args.quick,
            },
            "load_average": [load_before, os.getloadavg()],
        },
    )


if __name__ == "__main__":
    main()
