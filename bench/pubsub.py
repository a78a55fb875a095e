"""PUBLISH to N subscribers against redis-server, in publishes per second.

One publisher sends ``PUBLISH ch <64 B>`` unpipelined (one round trip each) or 16 to a
round trip (``P16``); N subscribers (1, 10, 100), each a raw socket drained by a
thread that only counts bytes, are subscribed to ``ch``. A publish's reply says how
many subscribers it reached, and the run checks that every subscriber received every
message's bytes before it ends, so what is measured is delivery, not queueing.

Baseline, started in the same run: redis-server without persistence. pion-server runs
one worker with its default write-ahead log (PUBLISH is not logged). Servers are
measured in turn, round after round; each figure is the median over the rounds.

Issue 32 target: >= 0.5x redis-server unpipelined.

    python bench/pubsub.py            # 3 rounds
    python bench/pubsub.py --quick    # 1 round, short runs
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Process, print_table, start_pion, start_redis, write_results

PAYLOAD = b"m" * 64
FANOUTS = (1, 10, 100)


def _command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Subscriber:
    """A subscribed socket whose thread counts the bytes that arrive."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(_command(b"SUBSCRIBE", b"ch"))
        self.received = 0
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while data := self.sock.recv(1 << 20):
                self.received += len(data)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's recv; close alone may not
        self.sock.close()
        self._thread.join(10)


def _wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.001)


def _numsub(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(_command(b"PUBSUB", b"NUMSUB", b"ch"))
        reply = b""
        while not reply.endswith(b"\r\n") or reply.count(b"\r\n") < 4:
            reply += c.recv(4096)
        return int(reply.split(b"\r\n")[3][1:])


def _run_case(port: int, fanout: int, pipeline: int, seconds: float) -> float:
    _wait_until(lambda: _numsub(port) == 0, "the last case's subscribers to leave")
    subs = [Subscriber(port) for _ in range(fanout)]
    _wait_until(lambda: _numsub(port) == fanout, "the subscriptions")
    confirm = len(b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n")
    _wait_until(lambda: all(s.received >= confirm for s in subs), "the subscriptions")
    base = [s.received for s in subs]
    pub = socket.create_connection(("127.0.0.1", port))
    pub.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    batch = _command(b"PUBLISH", b"ch", PAYLOAD) * pipeline
    reply = b":%d\r\n" % fanout
    sent = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pub.sendall(batch)
        want, got = len(reply) * pipeline, b""
        while len(got) < want:
            got += pub.recv(65536)
        if got != reply * pipeline:
            raise RuntimeError(f"unexpected PUBLISH replies: {got[:80]!r}")
        sent += pipeline
    message = len(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$%d\r\n%s\r\n" % (len(PAYLOAD), PAYLOAD))
    _wait_until(
        lambda: all(s.received - b >= sent * message for s, b in zip(subs, base, strict=True)),
        "every message",
    )
    elapsed = time.perf_counter() - start
    pub.close()
    for s in subs:
        s.close()
    return sent / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 round, short runs")
    opts = parser.parse_args()
    rounds, seconds = (1, 1.0) if opts.quick else (3, 3.0)
    servers: dict[str, Process] = {"redis-server": start_redis(), "pion-server": start_pion()}
    cases = [(n, p) for n in FANOUTS for p in (1, 16)]
    rates: dict[tuple[str, int, int], list[float]] = {}
    try:
        for _ in range(rounds):
            for fanout, pipeline in cases:
                for name, proc in servers.items():
                    rate = _run_case(proc.port, fanout, pipeline, seconds)
                    rates.setdefault((name, fanout, pipeline), []).append(rate)
    finally:
        for proc in servers.values():
            proc.stop()
    rows = []
    results = []
    for fanout, pipeline in cases:
        redis_rate = statistics.median(rates[("redis-server", fanout, pipeline)])
        pion_rate = statistics.median(rates[("pion-server", fanout, pipeline)])
        label = f"PUBLISH to {fanout}" + ("" if pipeline == 1 else f" P{pipeline}")
        rows.append([label, round(redis_rate), round(pion_rate), round(pion_rate / redis_rate, 2)])
        results.append(
            {"case": label, "redis_per_s": redis_rate, "pion_per_s": pion_rate, "rounds": rounds}
        )
    print_table(["case", "redis-server /s", "pion-server /s", "pion/redis"], rows)
    write_results("pubsub", {"cases": results, "payload_bytes": len(PAYLOAD)})


if __name__ == "__main__":
    main()
