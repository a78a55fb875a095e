"""redis-cli's operator modes against a real pion-server: --bigkeys, --memkeys,
--latency and --stat read what they need (SCAN, TYPE, STRLEN/HLEN/ZCARD, MEMORY USAGE,
PING, INFO) and print sensible figures. Each run is bounded: --latency in raw mode
exits after one interval, --stat is read until three rows came, then stopped."""

from __future__ import annotations

import re
import subprocess
import time

import redis

from pion.server.run import ServerThread


def _fill(server: ServerThread) -> redis.Redis:
    r = redis.Redis(port=server.port)
    r.mset({"a": "1", "b": "22", "c": "333"})
    r.hset("h", mapping={"f": "v", "g": "w"})
    r.zadd("z", {"x": 1, "y": 2})
    return r


def _cli(server: ServerThread, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(server.port), *args],
        capture_output=True,
        timeout=60,
        check=True,
    )
    return done.stdout.decode()


def test_bigkeys_finds_the_biggest_key_of_each_type(server: ServerThread) -> None:
    _fill(server).close()
    out = _cli(server, "--bigkeys")
    assert "Sampled 5 keys in the keyspace!" in out
    assert "Biggest string found '\"c\"' has 3 bytes" in out
    assert "Biggest   hash found '\"h\"' has 2 fields" in out
    assert "Biggest   zset found '\"z\"' has 2 members" in out
    assert "3 strings with 6 bytes" in out


def test_memkeys_reports_memory_usage(server: ServerThread) -> None:
    r = _fill(server)
    usage = {k: r.memory_usage(k) for k in ("c", "h", "z")}
    r.close()
    out = _cli(server, "--memkeys")
    assert f"Biggest   hash found '\"h\"' has {usage['h']} bytes" in out
    assert f"Biggest   zset found '\"z\"' has {usage['z']} bytes" in out
    assert f"Biggest string found '\"c\"' has {usage['c']} bytes" in out


def test_latency_samples_pings(server: ServerThread) -> None:
    out = _cli(server, "--latency", "--raw", "-i", "1")
    lo, hi, avg, samples = out.split()
    assert int(samples) > 0 and 0 <= int(lo) <= float(avg) <= int(hi)


def test_stat_prints_rows_of_live_figures(server: ServerThread) -> None:
    _fill(server).close()
    proc = subprocess.Popen(
        ["stdbuf", "-oL", "redis-cli", "-p", str(server.port), "--stat", "-i", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    rows: list[list[str]] = []
    deadline = time.monotonic() + 30
    try:
        while len(rows) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            if re.match(r"^\d", line):
                rows.append(line.split())
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
    assert len(rows) == 3, rows
    for keys, mem, clients, blocked, requests, *_ in rows:
        assert keys == "5" and mem[-1] in "BKMG" and int(clients) >= 1
        assert blocked == "0" and int(requests) > 0
