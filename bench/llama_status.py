"""Benchmark: how fast `pion llama proxy` answers ``GET /pion/status`` while it holds
hundreds of requests.

A real llama-server (``-np 1``, the tiny generated model of the tests) behind
``pion llama proxy --persist`` (a subprocess, the command a user runs). N chat requests
(Pi-shaped, one shared prefix, each its own question; 500 by default) are sent at once:
one slot, so all but one wait on its lease, and the proxy holds every connection. While
they run, a separate client asks ``/pion/status`` every 20 ms (one at a time, as a
dashboard or `pion llama status --watch` does) and records each answer's latency. That
client is another process (:class:`StatusPoller`): in the process that sends the burst,
its own event loop would wait behind the 500 requests it is sending, and that wait would
be counted as the proxy's. The baseline, in the same run: the same status requests
against the idle proxy before the load.

Target (issue 30, item 8): ``/pion/status`` answers within 100 ms under any load; reported
as p50, p99 and max under load against idle, and how many of the N requests answered 200
(a request that waited past ``--lease-wait`` is forwarded unwarmed, not refused).

Run: ``PYTHONPATH=src .venv/bin/python bench/llama_status.py [--requests 500] [--quick]``.
"""

from __future__ import annotations

import _common  # first: it puts scripts/ on sys.path for pion_testing; where results go

# isort: split

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from pion_testing.launcher import LlamaServerProcess
from pion_testing.llama_samples import pi_chat_body
from pion_testing.paths import ensure_llama_server
from pion_testing.testmodel import ModelSpec, make_model

from _llama_audit import ProxyProcess
from pion.llama.paths import cache_dir

TARGET_MS = 100.0
POLL_S = 0.02
IDLE_POLLS = 50


def model_path() -> Path:
    path = cache_dir() / "models" / "bench-status-tiny.gguf"
    if not path.exists():
        make_model(path, ModelSpec())
    return path


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    if not ordered:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "p50_ms": statistics.median(ordered),
        "p99_ms": p99,
        "max_ms": ordered[-1],
    }


def _poll(url: str, stop: Any, out: Any) -> None:
    """In the poller process: one ``GET /pion/status`` at a time, POLL_S apart, until
    ``stop``; sends each answer's latency in ms."""
    samples: list[float] = []
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            client.get(url + "/pion/status").raise_for_status()
            samples.append((time.perf_counter() - t0) * 1000.0)
            time.sleep(POLL_S)
    out.send(samples)


class StatusPoller:
    """Polls the status from another process while the ``with`` block runs."""

    def __init__(self, url: str) -> None:
        self._stop = multiprocessing.Event()
        self._recv, send = multiprocessing.Pipe(duplex=False)
        self._proc = multiprocessing.Process(
            target=_poll, args=(url, self._stop, send), daemon=True
        )
        self.samples: list[float] = []

    def __enter__(self) -> StatusPoller:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.samples = self._recv.recv()
        self._proc.join(timeout=60)


async def load(url: str, n: int) -> tuple[list[int], float]:
    """N chat requests at once: (the requests' HTTP statuses (0: no answer), seconds
    until the last answered)."""
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(i: int) -> int:
            try:
                body = pi_chat_body(f"question {i}", max_tokens=2)
                resp = await client.post(url + "/v1/chat/completions", json=body)
            except httpx.HTTPError:
                return 0
            return resp.status_code

        t0 = time.monotonic()
        statuses = await asyncio.gather(*(one(i) for i in range(n)))
        seconds = time.monotonic() - t0
    return list(statuses), seconds


def idle(url: str) -> list[float]:
    with StatusPoller(url) as poller:
        time.sleep(IDLE_POLLS * POLL_S * 1.5)
    return poller.samples


def run(n: int, lease_wait: float) -> dict[str, Any]:
    binary = ensure_llama_server()
    with tempfile.TemporaryDirectory(prefix="pion-bench-status-") as tmp:
        work = Path(tmp)
        slots = work / "slots"
        slots.mkdir()
        server = LlamaServerProcess(
            binary, model_path(), slot_dir=slots, log_path=work / "llama-server.log"
        )
        with server:
            proxy = ProxyProcess(
                server.url, slots, work / "proxy.log", "--lease-wait", f"{lease_wait:g}"
            )
            try:
                quiet_ms = idle(proxy.url)
                load_before = os.getloadavg()
                with StatusPoller(proxy.url) as poller:
                    statuses, seconds = asyncio.run(load(proxy.url, n))
                busy_ms = poller.samples
                load_after = os.getloadavg()
                counts = proxy.status().get("events", {})
            finally:
                proxy.stop()
    answered = sum(s == 200 for s in statuses)
    under = percentiles(busy_ms)
    return {
        "requests": n,
        "lease_wait_s": lease_wait,
        "answered_200": answered,
        "load_seconds": seconds,
        "idle": percentiles(quiet_ms),
        "under_load": under,
        "lease_waits": counts.get("lease_waits", 0),
        "lease_timeouts": counts.get("lease_timeouts", 0),
        "target_ms": TARGET_MS,
        "target_met": under["max_ms"] <= TARGET_MS,
        # The status answers in a thread of its own, which still needs a CPU: how shared
        # the machine was.
        "load_avg_before": load_before,
        "load_avg_after": load_after,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=500, help="chat requests sent at once")
    ap.add_argument("--lease-wait", type=float, default=30.0, help="the proxy's --lease-wait")
    ap.add_argument("--quick", action="store_true", help="smoke run: 40 requests")
    args = ap.parse_args()
    n = 40 if args.quick else args.requests
    result = run(n, args.lease_wait)
    _common.print_table(
        ["phase", "polls", "p50 ms", "p99 ms", "max ms"],
        [
            [phase, s["n"], s["p50_ms"], s["p99_ms"], s["max_ms"]]
            for phase, s in (("idle", result["idle"]), (f"{n} requests", result["under_load"]))
        ],
    )
    print(
        f"{result['answered_200']} of {n} answered 200 in {result['load_seconds']:.1f} s; "
        f"lease waits {result['lease_waits']}, lease timeouts {result['lease_timeouts']}"
    )
    _common.write_results("llama_status", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
