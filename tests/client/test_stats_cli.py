"""`pion stats` against a real server: the table and the JSON, and under -w 2 the sum
of every worker (with per-worker rows on demand)."""

from __future__ import annotations

import json
from pathlib import Path

import redis
from click.testing import CliRunner

from pion.client.cli import stats_command
from pion.server.run import ServerThread
from support import ServerProcess


def test_stats_json_and_table(server: ServerThread, client: redis.Redis) -> None:
    client.execute_command("KV.PREFIX.REGISTER", "a", 8, "fp16", "PREFILL_MS", 1500)
    client.execute_command("KV.PREFIX.REGISTER", "b", 8, "fp16")
    client.execute_command("KV.PREFIX.LOOKUP", "a")
    client.execute_command("KV.PREFIX.LOOKUP", "b", "TOKENS", 1000)
    client.execute_command("KV.PREFIX.LOOKUP", "zzz")
    runner = CliRunner()
    out = runner.invoke(stats_command, ["--port", str(server.port), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["receipt"]["kvprefix_hits"] == 2
    assert data["receipt"]["kvprefix_misses"] == 1
    assert data["receipt"]["kvprefix_prefill_us_measured"] == 1_500_000
    assert data["receipt"]["kvprefix_prefill_us_saved"] == 1_500_000 + 555_000
    assert data["registry"]["registered_prefixes"] == 2
    table = runner.invoke(stats_command, ["--port", str(server.port)])
    assert table.exit_code == 0, table.output
    assert "1.500 s over 1 hits" in table.output  # measured
    assert "0.555 s over 1 hits" in table.output  # estimated
    assert "registered_prefixes" in table.output


def test_stats_with_password(server_factory: object) -> None:
    srv = server_factory(requirepass="pw")  # type: ignore[operator]
    runner = CliRunner()
    denied = runner.invoke(stats_command, ["--port", str(srv.port)])
    assert denied.exit_code != 0 and "authenticat" in denied.output.lower()
    ok = runner.invoke(stats_command, ["--port", str(srv.port), "--password", "pw", "--json"])
    assert ok.exit_code == 0, ok.output


def test_stats_unreachable() -> None:
    out = CliRunner().invoke(stats_command, ["--port", "1"])
    assert out.exit_code != 0 and "127.0.0.1:1" in out.output


def test_stats_merges_every_worker(tmp_path: Path) -> None:
    """Under -w 2 a connection to the main port reaches one worker: `pion stats` reads
    each worker on its affinity port and shows their sum (per-worker rows on demand)."""
    srv = ServerProcess(
        tmp_path.parent, ["-w", "2", "--independent-workers", "--dir", str(tmp_path)]
    )
    try:
        for worker, (ns, prefill_ms) in enumerate((("a", 1500), ("b", 250))):
            w = srv.worker(worker)
            w.execute_command("KV.PREFIX.REGISTER", ns, 8, "fp16", "PREFILL_MS", prefill_ms)
            w.execute_command("KV.PREFIX.LOOKUP", ns)
            w.execute_command("KV.PREFIX.LOOKUP", f"missing-{worker}")
            w.close()
        srv.worker(1).execute_command("KV.PREFIX.LOOKUP", "nothing-here")
        runner = CliRunner()
        out = runner.invoke(stats_command, ["--port", str(srv.port), "--json", "--per-worker"])
        assert out.exit_code == 0, out.output
        data = json.loads(out.output)
        assert data["workers"] == 2
        rec, reg = data["receipt"], data["registry"]
        assert rec["kvprefix_hits"] == 2 and rec["kvprefix_misses"] == 3
        assert rec["kvprefix_prefill_us_measured"] == 1_750_000
        assert rec["prefill_seconds_avoided_measured"] == 1.75
        assert "worker_id" not in rec and "my_worker_id" not in reg
        assert reg["registered_prefixes"] == 2 and reg["vstore_sessions"] == 4
        assert reg["directory_entries"] == 2  # shared by the workers: counted once
        per = data["per_worker"]
        assert [w["receipt"]["worker_id"] for w in per] == [0, 1]
        assert [w["receipt"]["kvprefix_misses"] for w in per] == [1, 2]
        table = runner.invoke(stats_command, ["--port", str(srv.port), "--per-worker"])
        assert table.exit_code == 0, table.output
        assert "2 / 3" in table.output and "Per worker" in table.output
        plain = runner.invoke(stats_command, ["--port", str(srv.port), "--json"])
        assert "per_worker" not in json.loads(plain.output)
    finally:
        srv.stop()
        srv.close()
