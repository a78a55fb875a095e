"""`pion stats` against a real server: the table and the JSON."""

from __future__ import annotations

import json

import redis
from click.testing import CliRunner

from pion.client.cli import stats_command
from pion.server.run import ServerThread


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
