"""``--metrics-port``: the Prometheus endpoint parsed by prometheus_client's own
parser, its values checked against PION.STATS, KV.PREFIX.INFO and INFO, for one
process and for ``-w 2`` (one series per worker, merged by the supervisor)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from pion.commands import COMMAND_TABLE
from pion.commands.state import ClientState, Context, ServerState
from pion.config import ServerConfig
from pion.errors import PionError
from pion.prefix import Receipt
from pion.server.metrics import LATENCY_COMMANDS, WorkerMetrics, merge
from support import ServerProcess, make_store, wait_until
from support.workers import info_fields, sample, scrape, stats

ROWS = np.ones((6, 16), np.float32)
HASHES = np.arange(8, dtype="<u8")


def _workload(r: redis.Redis, ns: str) -> None:
    """A little of everything: hits and misses, a measured one, rows in and out, a
    membership probe and two errors."""
    r.execute_command(
        "KV.PREFIX.REGISTER", ns, 16, "fp16", "BLOCKS", 4, 8, HASHES.tobytes(), "PREFILL_MS", 1200
    )
    r.execute_command("V.STOREBATCH", f"{ns}_pk", 0, 0, 6, ROWS.tobytes())
    r.execute_command("V.STOREBATCH", f"{ns}_pv", 0, 0, 6, ROWS.tobytes())
    for _ in range(3):
        assert r.execute_command("KV.PREFIX.LOOKUP", ns) == b"HIT"
    r.execute_command("KV.PREFIX.LOOKUP", ns, "TOKENS", 10, "PREFILL_MS", 5)
    for _ in range(2):
        assert r.execute_command("KV.PREFIX.LOOKUP", f"{ns}-missing") == b"MISS"
    r.execute_command("V.FETCH", f"{ns}_pv", 0, "RANGE", 0, 6)
    r.execute_command("KV.PREFIX.MEMBERSHIP", ns, 2, HASHES[:2].tobytes())
    for bad in (("V.FETCH", "no-such-sid", 0, "RANGE", 0, 1), ("KV.PREFIX.LOOKUP", ns, "NOPE", 1)):
        with pytest.raises(redis.ResponseError):
            r.execute_command(*bad)


def _check_worker(families: dict[str, object], r: redis.Redis, worker: str) -> None:
    """Every receipt, V-store and WAL figure of ``worker`` equals what it reports."""
    s = stats(r)
    receipt = {
        "pion_kvprefix_hits_total": s["kvprefix_hits"],
        "pion_kvprefix_misses_total": s["kvprefix_misses"],
        "pion_kvprefix_hits_measured_total": s["kvprefix_hits_measured"],
        "pion_kvprefix_tokens_served_total": s["kvprefix_tokens_served"],
        "pion_kvprefix_bytes_served_total": s["kvprefix_bytes_served"],
        "pion_prefill_seconds_avoided_total": s["kvprefix_prefill_us_saved"] / 1e6,
        "pion_prefill_seconds_avoided_measured_total": s["kvprefix_prefill_us_measured"] / 1e6,
    }
    for name, want in receipt.items():
        assert sample(families, name, worker=worker) == pytest.approx(want), name
    info = info_fields(r.execute_command("KV.PREFIX.INFO"))
    for name, field in {
        "pion_vstore_bytes": "vstore_bytes",
        "pion_vstore_sessions": "vstore_sessions",
        "pion_vstore_max_sessions": "vstore_max_sessions",
        "pion_vstore_fetches_total": "vstore_total_fetches",
        "pion_vstore_evictions_total": "vstore_evictions",
        "pion_registered_prefixes": "registered_prefixes",
        "pion_wal_enabled": "wal_enabled",
        "pion_wal_bytes": "wal_bytes",
        "pion_wal_appended_records_total": "wal_appended",
        "pion_wal_replayed_records": "wal_replayed",
    }.items():
        assert sample(families, name, worker=worker) == int(info[field]), name
    persistence = r.info("persistence")
    assert sample(families, "pion_wal_ok", worker=worker) == 1
    assert sample(families, "pion_loading", worker=worker) == persistence["loading"] == 0
    assert (
        sample(families, "pion_changes_since_last_snapshot", worker=worker)
        == (persistence["rdb_changes_since_last_save"])
    )


def _check_commands(families: dict[str, object], worker: str) -> None:
    """The workload's commands by name, its errors, and the latency histograms."""
    calls = {"KV.PREFIX.LOOKUP": 7, "V.STOREBATCH": 2, "V.FETCH": 2, "KV.PREFIX.MEMBERSHIP": 1}
    for command, n in calls.items():
        labels = {"worker": worker, "command": command}
        assert sample(families, "pion_commands_total", **labels) == n
        assert sample(families, "pion_command_duration_seconds_count", **labels) == n
        buckets = [
            s
            for s in families["pion_command_duration_seconds"].samples  # type: ignore[attr-defined]
            if s.name.endswith("_bucket") and s.labels["command"] == command
            and s.labels["worker"] == worker
        ]  # fmt: skip
        assert [b.value for b in buckets] == sorted(b.value for b in buckets)
        assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == n
    for command, n in {"V.FETCH": 1, "KV.PREFIX.LOOKUP": 1, "V.STOREBATCH": 0}.items():
        labels = {"worker": worker, "command": command}
        assert sample(families, "pion_command_errors_total", **labels) == n
    # Only the four hot paths have histograms; every command has a counter.
    timed = {
        s.labels["command"]
        for s in families["pion_command_duration_seconds"].samples  # type: ignore[attr-defined]
    }
    assert timed == set(LATENCY_COMMANDS)
    counted = {
        s.labels["command"]
        for s in families["pion_commands"].samples  # type: ignore[attr-defined]
        if s.labels["worker"] == worker
    }
    assert counted == set(COMMAND_TABLE)


def test_single_process_endpoint_matches_the_server(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path.parent, ["--dir", str(tmp_path), "--metrics-port", "0"])
    try:
        assert srv.metrics_port is not None
        r = srv.client(protocol=2)
        _workload(r, "one")
        families = scrape(srv.metrics_port)
        _check_worker(families, r, "0")
        _check_commands(families, "0")
        assert sample(families, "pion_connected_clients", worker="0") == 1
        assert sample(families, "pion_uptime_seconds", worker="0") >= 0
        assert "pion_worker_up" not in families  # no supervisor here
        # PION.STATS RESET shows on the next scrape (the counters restart, as after a
        # restart; Prometheus's rate() handles that).
        r.execute_command("PION.STATS", "RESET")
        assert sample(scrape(srv.metrics_port), "pion_kvprefix_hits_total", worker="0") == 0
    finally:
        srv.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path.parent,
        ["-w", "2", "--independent-workers", "--dir", str(tmp_path), "--metrics-port", "0"],
    )
    yield srv
    srv.close()


def test_workers_are_merged_one_series_each(cluster: ServerProcess) -> None:
    assert cluster.metrics_port is not None
    w0, w1 = cluster.worker(0, protocol=2), cluster.worker(1, protocol=2)
    _workload(w0, "zero")
    _workload(w1, "one")
    w1.execute_command("KV.PREFIX.LOOKUP", "zero")  # a cross-worker hit, on worker 1
    families = scrape(cluster.metrics_port)
    for worker, r in (("0", w0), ("1", w1)):
        _check_worker(families, r, worker)
    assert sample(families, "pion_kvprefix_hits_total", worker="1") == 5
    assert sample(families, "pion_kvprefix_hits_total", worker="0") == 4
    assert sample(families, "pion_workers") == 2
    directory = info_fields(w0.execute_command("KV.PREFIX.INFO"))["directory_entries"]
    assert sample(families, "pion_directory_entries") == int(directory) == 2
    for worker in ("0", "1"):
        assert sample(families, "pion_worker_up", worker=worker) == 1
        assert sample(families, "pion_worker_restarts_total", worker=worker) == 0

    # A worker killed and restarted: counted, and back in the scrape with its receipt
    # started afresh (it is a new process) and its data recovered.
    victim = int(w1.info("server")["process_id"])
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: int(cluster.worker(1).info("server")["process_id"]) != victim)
    after = wait_until(
        lambda: (
            (f := scrape(cluster.metrics_port))  # type: ignore[arg-type]
            and sample(f, "pion_worker_up", worker="1") == 1
            and f
        )
    )
    assert sample(after, "pion_worker_restarts_total", worker="1") == 1
    assert sample(after, "pion_kvprefix_hits_total", worker="1") == 0
    assert sample(after, "pion_registered_prefixes", worker="1") == 1
    assert sample(after, "pion_wal_replayed_records", worker="1") > 0


# -- units -----------------------------------------------------------------------------


def test_metered_table_counts_errors_and_times_the_hot_paths() -> None:
    config = ServerConfig(worker_id=3)
    state = ServerState(config=config, vstore=make_store(), receipt=Receipt(worker_id=3))
    metrics = WorkerMetrics(state)
    table = metrics.meter(COMMAND_TABLE)
    assert set(table) == set(COMMAND_TABLE)
    ctx = Context(state=state, client=ClientState(id=1), table=table)
    table["KV.PREFIX.REGISTER"].handler(ctx, [b"ns", b"8", b"fp16"])
    table["KV.PREFIX.LOOKUP"].handler(ctx, [b"ns"])
    with pytest.raises(PionError):
        table["KV.PREFIX.LOOKUP"].handler(ctx, [b"ns", b"BAD", b"1"])
    text = generate_latest(metrics.registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    labels = {"worker": "3", "command": "KV.PREFIX.LOOKUP"}
    assert sample(families, "pion_commands_total", **labels) == 2
    assert sample(families, "pion_command_errors_total", **labels) == 1
    assert sample(families, "pion_command_duration_seconds_count", **labels) == 2
    assert sample(families, "pion_kvprefix_hits_total", worker="3") == 1
    assert sample(families, "pion_wal_enabled", worker="3") == 0  # no persistence here


def test_merge_keeps_one_family_per_name() -> None:
    def worker(w: str, hits: float) -> list[object]:
        c = CounterMetricFamily("pion_kvprefix_hits", "hits", labels=["worker"])
        c.add_metric([w], hits)
        g = GaugeMetricFamily("pion_vstore_bytes", "bytes", labels=["worker"])
        g.add_metric([w], hits * 10)
        return [c, g]

    merged = merge([worker("0", 1), worker("1", 2)])  # type: ignore[list-item]
    assert [f.name for f in merged] == ["pion_kvprefix_hits", "pion_vstore_bytes"]
    assert [(s.labels["worker"], s.value) for s in merged[0].samples] == [("0", 1), ("1", 2)]
