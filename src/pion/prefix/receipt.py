"""The value receipt: what a worker's prefix hits are worth (``PION.STATS``).

Crediting a ``KV.PREFIX.LOOKUP`` hit (docs/protocol.md, "Value receipt"):

* tokens = the K side's layer-0 high-water mark (0 on a cross-worker directory hit),
  time = the PREFILL_MS registered with the prefix;
* ``TOKENS n`` replaces both: tokens = n, time = this call's PREFILL_MS or 0;
* ``PREFILL_MS ms`` alone replaces the time.

A time above 0 is counted as *measured*. Otherwise the hit is credited with an
estimate of ``tokens x 555 us`` (Pion's constant: ~1.8k tokens/s of cold prefill).
``kvprefix_bytes_served`` is what Pion's receipt defines (docs/protocol.md, "Value
receipt"): the payload bytes every V.FETCH delivered (RANGE, id lists, BATCH,
NATIVE), counted as the reply is built, whichever session it read; a LOOKUP credits
no bytes (the rows have not moved yet).

The semantic/moe/vector fields belong to Pion subsystems we do not implement; they
stay 0 so a dashboard built for Pion still parses our reply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["ESTIMATE_US_PER_TOKEN", "Receipt"]

# Pion's documented estimate of cold prefill cost per token when nothing was measured.
ESTIMATE_US_PER_TOKEN = 555


def _seconds(us: int) -> str:
    """Microseconds as Pion's ``S.mmm`` text (millisecond resolution, truncated)."""
    ms = us // 1000
    return f"{ms // 1000}.{ms % 1000:03d}"


@dataclass
class Receipt:
    worker_id: int = 0
    started_monotonic: float = field(default_factory=time.monotonic)
    hits: int = 0
    misses: int = 0
    hits_measured: int = 0
    tokens_served: int = 0
    bytes_served: int = 0
    prefill_us_saved: int = 0
    prefill_us_measured: int = 0

    def credit_hit(self, tokens: int, prefill_ms: int) -> None:
        self.hits += 1
        self.tokens_served += tokens
        if prefill_ms > 0:
            us = prefill_ms * 1000
            self.hits_measured += 1
            self.prefill_us_measured += us
        else:
            us = tokens * ESTIMATE_US_PER_TOKEN
        self.prefill_us_saved += us

    def credit_miss(self) -> None:
        self.misses += 1

    def credit_bytes(self, nbytes: int) -> None:
        """A V.FETCH delivered ``nbytes`` of payload."""
        self.bytes_served += nbytes

    def reset(self) -> None:
        """PION.STATS RESET / CONFIG RESETSTAT; uptime is not a counter."""
        self.hits = self.misses = self.hits_measured = 0
        self.tokens_served = self.bytes_served = 0
        self.prefill_us_saved = self.prefill_us_measured = 0

    def uptime(self) -> int:
        return int(time.monotonic() - self.started_monotonic)

    def pairs(self) -> dict[str, int | str]:
        """The 16 PION.STATS fields, in wire order."""
        return {
            "worker_id": self.worker_id,
            "uptime_in_seconds": self.uptime(),
            "kvprefix_hits": self.hits,
            "kvprefix_misses": self.misses,
            "kvprefix_hits_measured": self.hits_measured,
            "kvprefix_tokens_served": self.tokens_served,
            "kvprefix_bytes_served": self.bytes_served,
            "kvprefix_prefill_us_saved": self.prefill_us_saved,
            "kvprefix_prefill_us_measured": self.prefill_us_measured,
            "prefill_seconds_avoided": _seconds(self.prefill_us_saved),
            "prefill_seconds_avoided_measured": _seconds(self.prefill_us_measured),
            "semantic_hits": 0,
            "semantic_misses": 0,
            "moe_hits": 0,
            "moe_misses": 0,
            "vector_queries": 0,
        }

    def info_lines(self) -> list[str]:
        """INFO's ``# Pion`` section: scope and worker, then the counters without
        uptime and without the ``_us`` fields."""
        lines = ["stats_scope:worker", f"worker_id:{self.worker_id}"]
        for key, value in self.pairs().items():
            if key in ("worker_id", "uptime_in_seconds") or key.endswith("_us_saved"):
                continue
            if key.endswith("_us_measured"):
                continue
            lines.append(f"{key}:{value}")
        return lines
