"""``--tier`` and its options become a TierConfig; tier options without ``--tier``, a
bad URL or prefix are usage errors. Without a tier, INFO and PION.STATS are as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
import redis

from pion.cli import _build_config, server_command
from pion.config import ServerConfig, TierConfig


def _config(*args: str) -> ServerConfig:
    ctx = server_command.make_context("pion-server", list(args))
    return _build_config(ctx.params)


def test_tier_options_make_a_tier_config(tmp_path: Path) -> None:
    assert _config().tier is None
    secret = tmp_path / "pw"
    secret.write_text("hunter2\nignored\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    cfg = _config(
        "--tier", "rediss://h1:7000,h2:7001", "--tier-write", "async", "--tier-user", "pion",
        "--tier-password-file", str(secret), "--tier-tls-ca", str(ca), "--tier-prefix", "prod",
        "--tier-timeout", "0.5", "--tier-queue-max", "1mb",
    )  # fmt: skip
    assert cfg.tier == TierConfig(
        url="rediss://h1:7000,h2:7001",
        write="async",
        username="pion",
        password="hunter2",
        tls_ca_file=ca,
        prefix="prod",
        timeout=0.5,
        queue_max_bytes=1 << 20,
    )
    assert _config("--tier", "redis://h:1").tier == TierConfig(url="redis://h:1")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--tier-password", "x"], "--tier-password needs --tier"),
        (["--tier-tls"], "--tier-tls needs --tier"),
        (["--tier", "http://h:1"], "redis://"),
        (["--tier", "redis://h:1", "--tier-prefix", "a:b"], "tier prefix"),
        (["--tier", "redis://h:1", "--tier-queue-max", "0"], "at least 1 byte"),
    ],
)
def test_bad_tier_options_are_usage_errors(args: list[str], error: str) -> None:
    with pytest.raises(click.UsageError, match=error):
        _config(*args)


def test_without_a_tier_info_says_so_and_stats_keep_sixteen_pairs(
    server_factory: Callable[..., Any],
) -> None:
    srv = server_factory()
    r = redis.Redis(port=srv.port, protocol=2)
    assert r.info("tier") == {"tier_enabled": 0}
    assert len(r.execute_command("PION.STATS")) == 32
    assert "tier_enabled" in r.info()
