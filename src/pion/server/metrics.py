"""Prometheus metrics (``--metrics-port``), with ``prometheus_client``
(docs/deployment.md, "Metrics").

What a worker exports, every series labelled ``worker``:

- the value receipt (``PION.STATS``): ``pion_kvprefix_hits_total``, ``..._misses_total``,
  ``..._hits_measured_total``, ``..._tokens_served_total``, ``..._bytes_served_total``,
  ``pion_prefill_seconds_avoided_total`` and ``..._measured_total``, ``pion_uptime_seconds``;
- the V-store: ``pion_vstore_bytes``, ``..._allocated_bytes``, ``..._sessions``,
  ``..._max_sessions``, ``..._maxmemory_bytes``, ``..._tokens``,
  ``..._fetches_total``, ``..._evictions_total``, ``pion_registered_prefixes``;
- commands and errors by name: ``pion_commands_total{command}``,
  ``pion_command_errors_total{command}`` (errors the command answered: bad arguments,
  redirects, OOM, ...), and for KV.PREFIX.LOOKUP, KV.PREFIX.MEMBERSHIP, V.STOREBATCH and
  V.FETCH ``pion_command_duration_seconds{command}``, a histogram of the time spent in
  the command on the event loop (not the network);
- the server: ``pion_connected_clients``, ``pion_connections_received_total``,
  ``pion_commands_processed_total``, ``pion_protocol_errors_total``,
  ``pion_internal_errors_total``, ``pion_client_io_errors_total`` (connections lost to
  a socket error, replies that could not be written), ``pion_evicted_clients_total``,
  ``pion_rejected_connections_total``, ``pion_slices_yielded_total``, ``pion_loading``,
  ``pion_resident_memory_bytes``;
- the WAL and snapshots: ``pion_wal_enabled``, ``pion_wal_ok``, ``pion_wal_bytes``,
  ``pion_wal_appended_records_total``, ``pion_wal_replayed_records``,
  ``pion_snapshot_bytes``, ``pion_snapshot_last_ok``,
  ``pion_snapshot_last_save_timestamp_seconds``, ``pion_changes_since_last_snapshot``,
  ``pion_recovery_seconds``.

The endpoint (``scrapes.py``) is served on the event loop, so a scrape reads the
state between two commands, on the thread that owns it. Under ``-w N`` the
supervisor serves the endpoint and asks each worker for its snapshot over the
control pipe; :func:`merge` joins the workers' families (one family, one series per
worker) and the supervisor adds its own (``pion_worker_up``,
``pion_worker_restarts_total``, ``pion_workers``, ``pion_directory_entries``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from types import MappingProxyType

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from pion.commands.deferred import Deferred
from pion.commands.info import rss_bytes
from pion.commands.state import Command, CommandTable, Context, ServerState
from pion.config import ServerConfig
from pion.resp.reply import Reply
from pion.server.scrapes import MetricsEndpoint

__all__ = [
    "LATENCY_BUCKETS",
    "LATENCY_COMMANDS",
    "SCRAPE_TIMEOUT_S",
    "MetricsEndpoint",
    "WorkerMetrics",
    "merge",
]

# The commands whose latency is a histogram (the four hot paths).
LATENCY_COMMANDS = ("KV.PREFIX.LOOKUP", "KV.PREFIX.MEMBERSHIP", "V.STOREBATCH", "V.FETCH")
# 10 us (a LOOKUP) to 10 s (a multi-GB fetch).
LATENCY_BUCKETS = (
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# How long a scrape waits for the event loop (or a worker) before giving up on it.
SCRAPE_TIMEOUT_S = 5.0


class _StateCollector:
    """The worker's state as metric families, read at collect time."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.worker = str(state.config.worker_id)
        state.metered = True  # its handlers are counted here: no runs bypass them

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["worker"])
        family.add_metric([self.worker], value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["worker"])
        family.add_metric([self.worker], value)
        return family

    def collect(self) -> Iterator[Metric]:
        s = self.state
        r = s.receipt
        c, g = self._counter, self._gauge
        yield c("pion_kvprefix_hits", "KV.PREFIX.LOOKUP hits (PION.STATS)", r.hits)
        yield c("pion_kvprefix_misses", "KV.PREFIX.LOOKUP misses", r.misses)
        yield c("pion_kvprefix_hits_measured", "Hits credited a reported time", r.hits_measured)
        yield c(
            "pion_kvprefix_tokens_served",
            "Prefix tokens whose prefill was skipped",
            r.tokens_served,
        )
        yield c("pion_kvprefix_bytes_served", "V.FETCH payload bytes", r.bytes_served)
        yield c(
            "pion_prefill_seconds_avoided",
            "Prefill time skipped, measured + estimated",
            r.prefill_us_saved / 1e6,
        )
        yield c(
            "pion_prefill_seconds_avoided_measured",
            "Prefill time skipped, measured",
            r.prefill_us_measured / 1e6,
        )
        yield g("pion_uptime_seconds", "Seconds since the worker started", r.uptime())
        vs = s.vstore
        yield g("pion_vstore_bytes", "K/V bytes held in stored format", vs.vstore_bytes)
        yield g("pion_vstore_allocated_bytes", "Bytes of V-store buffers", vs.bytes_allocated)
        yield g("pion_vstore_sessions", "V-store sessions", vs.session_count)
        yield g("pion_vstore_max_sessions", "Sessions before LRU eviction", vs.max_sessions)
        yield g("pion_vstore_maxmemory_bytes", "Byte budget (0 = none)", vs.maxmemory)
        yield g("pion_vstore_tokens", "Rows held, all layers", vs.total_tokens)
        yield c("pion_vstore_fetches", "Layer reads served", vs.total_fetches)
        yield c("pion_vstore_evictions", "Sessions evicted", vs.evictions)
        yield g(
            "pion_registered_prefixes",
            "Namespaces with both halves held",
            len(s.registry.registered()),
        )
        k = s.counters
        yield g("pion_connected_clients", "Open client connections", len(s.clients))
        yield c("pion_connections_received", "Connections accepted", k.total_connections_received)
        yield c("pion_commands_processed", "Commands processed", k.total_commands_processed)
        yield c("pion_protocol_errors", "Protocol errors (connection closed)", k.protocol_errors)
        yield c("pion_internal_errors", "Commands answered 'internal error'", k.internal_errors)
        yield c("pion_client_io_errors", "Client connections lost to a socket error", k.io_errors)
        yield c("pion_evicted_clients", "Clients evicted by maxmemory-clients", k.evicted_clients)
        yield c(
            "pion_rejected_connections", "Connections refused (maxclients)", k.rejected_connections
        )
        yield c(
            "pion_slices_yielded", "Times a client's slice of the loop ran out", k.slices_yielded
        )
        yield g("pion_loading", "1 while the data directory is recovered", int(s.loading))
        yield g("pion_resident_memory_bytes", "Resident set size", rss_bytes())
        yield from self._persistence()

    def _persistence(self) -> Iterator[Metric]:
        c, g = self._counter, self._gauge
        info = self.state.persistence.info() if self.state.persistence is not None else {}

        def num(key: str) -> float:
            value = info.get(key, 0)
            return float(value) if isinstance(value, int | float) else 0.0

        yield g("pion_wal_enabled", "1 when the write-ahead log is on", num("wal_enabled"))
        yield g(
            "pion_wal_ok",
            "0 while writes are refused (MISCONF)",
            int(info.get("wal_status", "ok") == "ok"),
        )
        yield g("pion_wal_bytes", "Size of the write-ahead log", num("wal_bytes"))
        yield c(
            "pion_wal_appended_records", "Records appended by this process", num("wal_appended")
        )
        yield g("pion_wal_replayed_records", "Records replayed at start", num("wal_replayed"))
        yield g("pion_snapshot_bytes", "Size of the last snapshot", num("snapshot_bytes"))
        yield g(
            "pion_snapshot_last_ok",
            "0 when the last snapshot failed",
            int(info.get("rdb_last_bgsave_status", "ok") == "ok"),
        )
        yield g(
            "pion_snapshot_last_save_timestamp_seconds",
            "Unix time of the last snapshot",
            num("rdb_last_save_time"),
        )
        yield g(
            "pion_changes_since_last_snapshot",
            "Mutations since the last snapshot",
            num("rdb_changes_since_last_save"),
        )
        yield g(
            "pion_recovery_seconds",
            "Time the last start spent recovering",
            num("recovery_ms") / 1000,
        )


class WorkerMetrics:
    """One worker's registry: its state, and the command counters the metered table
    (:meth:`meter`) feeds."""

    def __init__(self, state: ServerState) -> None:
        self.worker = str(state.config.worker_id)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StateCollector(state))
        self.calls = Counter(
            "pion_commands",
            "Commands run, by name",
            ["worker", "command"],
            registry=self.registry,
        )
        self.errors = Counter(
            "pion_command_errors",
            "Commands that answered an error, by name",
            ["worker", "command"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "pion_command_duration_seconds",
            "Time spent in the command on the event loop",
            ["worker", "command"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def meter(self, table: CommandTable) -> CommandTable:
        """``table`` with every handler counted (and the four hot paths timed)."""
        return MappingProxyType({name: self._metered(cmd) for name, cmd in table.items()})

    def _metered(self, cmd: Command) -> Command:
        handler = cmd.handler
        calls = self.calls.labels(self.worker, cmd.name)
        errors = self.errors.labels(self.worker, cmd.name)
        hist = self.latency.labels(self.worker, cmd.name) if cmd.name in LATENCY_COMMANDS else None
        clock = time.perf_counter

        def run(ctx: Context, args: Sequence[bytes]) -> Reply | Deferred:
            # A deferred command is timed up to its hand-off (its time on the loop).
            start = clock()
            try:
                return handler(ctx, args)
            except Exception:
                errors.inc()
                raise
            finally:
                calls.inc()
                if hist is not None:
                    hist.observe(clock() - start)

        return dataclasses.replace(cmd, handler=run)

    def collect(self) -> list[Metric]:
        """Every family now (call on the event loop's thread)."""
        return list(self.registry.collect())

    async def snapshot(self) -> list[Metric]:
        """:meth:`collect` as a coroutine, for :class:`LoopCollector`."""
        return self.collect()

    def serve(self, config: ServerConfig) -> MetricsEndpoint:
        """The endpoint of a single-process server (call on its running loop)."""
        return MetricsEndpoint(config, self.snapshot)


def merge(groups: Iterable[Iterable[Metric]]) -> list[Metric]:
    """Families of several workers joined by name: one family (one HELP and TYPE)
    holding every worker's samples, which the ``worker`` label keeps apart."""
    merged: dict[str, Metric] = {}
    for families in groups:
        for family in families:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            into.samples.extend(family.samples)
    return list(merged.values())
