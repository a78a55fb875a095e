"""Is the tier reachable? A circuit breaker with exponential backoff, and the counters
INFO's ``# Tier`` section reports (errors, latency).

Shared by the worker's event loop (reads, read-through fills) and the writer thread,
so every method takes a lock. After a failure the tier is *down*: reads fail fast
without touching the network and the writer waits, until the backoff has passed (0.2 s,
doubling, at most 5 s); then the next operation is the probe. The first failure and the
way back each write one log line, so an operator sees an outage and its end, never a
line per request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["INITIAL_BACKOFF_S", "MAX_BACKOFF_S", "Health", "Latency"]

log = logging.getLogger("pion.tier")

INITIAL_BACKOFF_S = 0.2
# Long enough not to hammer a cluster that is restarting, short enough that a node
# back from a restart is used again within seconds.
MAX_BACKOFF_S = 5.0
_MAX_ERROR_TEXT = 200

Kind = Literal["read", "write"]


@dataclass
class Latency:
    count: int = 0
    total_us: int = 0
    max_us: int = 0

    def add(self, seconds: float) -> None:
        us = int(seconds * 1e6)
        self.count += 1
        self.total_us += us
        self.max_us = max(self.max_us, us)

    @property
    def avg_us(self) -> int:
        return self.total_us // self.count if self.count else 0


class Health:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._retry_at = 0.0
        self._backoff = INITIAL_BACKOFF_S
        self.down_since: float | None = None
        self.consecutive_failures = 0
        self.last_error = ""
        self.read_errors = 0
        self.write_errors = 0
        self.outages = 0
        self.latency: dict[Kind, Latency] = {"read": Latency(), "write": Latency()}

    @property
    def up(self) -> bool:
        return self.down_since is None

    def available(self) -> bool:
        """True when an operation may be tried now (up, or the backoff has passed)."""
        with self._lock:
            return self.down_since is None or self._clock() >= self._retry_at

    def retry_in(self) -> float:
        with self._lock:
            return max(0.0, self._retry_at - self._clock()) if self.down_since else 0.0

    def success(self, kind: Kind, seconds: float) -> None:
        with self._lock:
            self.latency[kind].add(seconds)
            if self.down_since is None:
                return
            outage = self._clock() - self.down_since
            self.down_since = None
            self.consecutive_failures = 0
            self._backoff = INITIAL_BACKOFF_S
        log.warning("tier reachable again after %.1f s", outage)

    def failure(self, kind: Kind, error: str) -> None:
        # One line, bounded: it goes into log lines and INFO.
        error = " ".join(error.split())[:_MAX_ERROR_TEXT]
        with self._lock:
            if kind == "read":
                self.read_errors += 1
            else:
                self.write_errors += 1
            self.last_error = error
            self.consecutive_failures += 1
            now = self._clock()
            first = self.down_since is None
            if first:
                self.down_since = now
                self.outages += 1
                self._backoff = INITIAL_BACKOFF_S
            self._retry_at = now + self._backoff
            wait = self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        if first:
            log.warning(
                "tier unavailable (%s): serving from the local V-store, queueing writes; "
                "retrying in %.1f s",
                error,
                wait,
            )
        else:
            log.debug("tier still unavailable (%s); next try in %.1f s", error, wait)

    def status(self) -> str:
        return "ok" if self.up else "down"

    def fields(self) -> dict[str, int | str]:
        """INFO fields (``tier_`` prefix added by the caller)."""
        with self._lock:
            now = self._clock()
            read, write = self.latency["read"], self.latency["write"]
            return {
                "status": "ok" if self.down_since is None else "down",
                "down_seconds": 0 if self.down_since is None else int(now - self.down_since),
                "outages": self.outages,
                "consecutive_failures": self.consecutive_failures,
                "read_errors": self.read_errors,
                "write_errors": self.write_errors,
                "errors": self.read_errors + self.write_errors,
                "last_error": self.last_error,
                "read_ops": read.count,
                "read_latency_avg_us": read.avg_us,
                "read_latency_max_us": read.max_us,
                "write_ops": write.count,
                "write_latency_avg_us": write.avg_us,
                "write_latency_max_us": write.max_us,
            }
