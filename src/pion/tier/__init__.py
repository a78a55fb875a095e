"""The shared second tier: prefix K/V on a Valkey / Redis Cluster (or one redis-server)
behind every node's in-memory V-store (docs/tier.md).

Each pion-server keeps its V-store as the first tier. Every V-store mutation reaches the
tier through a journal, like the WAL; a session a command needs and the V-store does not
hold is filled from the tier, in stored format, bit-exact. The tier never fails a
request the local V-store can answer: while it is down, reads that need it fail with a
clear ``TierError`` and writes are queued, retried and drained when it returns.

Reading order:

- ``url.py``      ``--tier`` addresses
- ``keys.py``     the key layout (format version 1) and the row-chunk geometry
- ``meta.py``     a session's metadata in the tier, checked strictly on the way in
- ``client.py``   redis-py ``RedisCluster`` / ``Redis``, errors sorted into retryable
                  and refused
- ``health.py``   circuit breaker, backoff, error and latency counters
- ``remote.py``   the operations (Lua scripts for the metadata, pipelines for rows)
- ``ops.py``, ``ledger.py``, ``writer.py``, ``journal.py``   the write path
- ``rowread.py``  row chunks read from every node at once, into their rows
- ``fill.py``     the read path (read-through fill)
- ``inflight.py`` a fill still being read, and fetch replies streamed from it
- ``service.py``  :class:`Tier`: what the server and the handlers call

Depends on ``vstore``, ``codecs``, ``config``, ``errors``, ``wire`` and redis-py; the
commands import it, never the other way round.
"""

from __future__ import annotations

from pion.tier.keys import CHUNK_ROWS, FORMAT_VERSION, KeyLayout
from pion.tier.service import Tier
from pion.tier.url import TierEndpoint, parse_tier_url

__all__ = ["CHUNK_ROWS", "FORMAT_VERSION", "KeyLayout", "Tier", "TierEndpoint", "parse_tier_url"]
